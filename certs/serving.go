package certs

import "net"

// The serving certificates kube-apiserver verifies: the admission webhooks' (served by every
// qvirt-controller replica) and qvirt-api's (the aggregated API). Both are signed by qvirt's CA;
// the controller writes its trust bundle into the caBundle of every configuration that names
// one of these Services (CABundleTargets).
const (
	// WebhookSecret holds the webhook server's certificate (WebhookService's DNS names), its key
	// and the bundle; every qvirt-controller replica serves with it.
	WebhookSecret = "qvirt-webhook-cert"
	// APIServingSecret holds qvirt-api's serving certificate (APIServiceName's DNS names).
	APIServingSecret = "qvirt-api-serving"

	// WebhookService and APIServiceName are the Services kube-apiserver reaches the webhook
	// server and qvirt-api through, in the install namespace.
	WebhookService = "qvirt-controller-webhook"
	APIServiceName = "qvirt-api"
)

// ServingSpec is the leaf of a server reached through Service name in namespace: CN
// NAME.NAMESPACE.svc (the name kube-apiserver checks for a webhook or an APIService) and DNS SANs
// NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local, serverAuth only. The bare Service
// name is deliberately absent: qvirt-api's client certificate is named qvirt-api, and a serving
// certificate must not share a name any peer allows. ips are extra IP SANs, for a server reached
// by address (none in a cluster).
func ServingSpec(name, namespace string, ips ...net.IP) LeafSpec {
	svc := name + "." + namespace + ".svc"
	return LeafSpec{CommonName: svc, DNSNames: []string{svc, svc + ".cluster.local"}, IPs: ips, Server: true}
}

// CABundleTarget is an object whose caBundle the controller keeps equal to qvirt's trust bundle:
// a ValidatingWebhookConfiguration or MutatingWebhookConfiguration (every webhook of it) or an
// APIService (spec.caBundle).
type CABundleTarget struct {
	// Kind is ValidatingWebhookConfiguration, MutatingWebhookConfiguration or APIService.
	Kind string
	Name string
}

// The kinds a CABundleTarget may have.
const (
	KindValidatingWebhook = "ValidatingWebhookConfiguration"
	KindMutatingWebhook   = "MutatingWebhookConfiguration"
	KindAPIService        = "APIService"
)

// CABundleTargets are the configurations config/ installs that name a Service serving with one
// of the certificates above. config's manifest test checks that every webhook configuration and
// APIService config/default installs is here.
var CABundleTargets = []CABundleTarget{
	{KindValidatingWebhook, "qvirt-validating-webhook"},
	{KindMutatingWebhook, "qvirt-mutating-webhook"},
	{KindAPIService, "v1alpha1.subresources.qvirt.io"},
}
