// Package certs makes and serves the certificates of the mutual TLS links qvirt runs itself:
// qvirt-api (client) → qvirt-handler's stream server (server), and qvirt-handler (client) →
// another node's qvirt-handler migration endpoint (server, handler/migproxy); and the serving
// certificates kube-apiserver verifies when it calls the admission webhooks (served by every
// qvirt-controller replica) and qvirt-api (the aggregated API). It has pure
// functions to make a CA and leaves (ECDSA P-256), encode and decode them as PEM, and decide when
// one must be replaced; a Source that watches one Secret and a BundleSource that watches the
// trust bundle ConfigMap; a node agent's own certificate, requested from qvirt-controller
// (NodeCertificate); and the server and client tls.Configs built on them. The reconciler that
// keeps the Secrets and signs the node agents' requests is controllers/certs, in qvirt-controller.
//
// # What is where
//
// All live in qvirt's install namespace (qvirt-system) and carry the label qvirt.io/certificates
// (ca, api, webhook, api-serving, bundle), which the controller's watch selects.
//
//	object                     holds                                                     read by
//	Secret qvirt-ca            tls.crt CA certificate (CN qvirt-ca), tls.key its key,    qvirt-controller only
//	                           ca.crt current CA [+ previous]
//	Secret qvirt-api-certs     tls.crt client leaf (CN qvirt-api, clientAuth), tls.key,  qvirt-api
//	                           ca.crt the bundle
//	ConfigMap qvirt-ca-bundle  ca.crt the bundle (public)                                every qvirt-handler
//	Secret qvirt-webhook-cert  tls.crt serving leaf (CN and DNS qvirt-controller-webhook  every qvirt-controller
//	                           .NS.svc[.cluster.local], serverAuth), tls.key, ca.crt      replica (a Source)
//	Secret qvirt-api-serving   tls.crt serving leaf (qvirt-api.NS.svc[...]), tls.key,    qvirt-api (mounted,
//	                           ca.crt                                                    or --tls-secret)
//
// The same bundle is written into the caBundle of every webhook of the webhook configurations
// and of the APIService that config/ installs (CABundleTargets), so kube-apiserver trusts both
// serving certificates, through CA rotations, with nothing done by hand. The serving leaves name
// no peer of the mutual TLS links (not qvirt-api, not qvirt-handler) and carry serverAuth only:
// holding one does not let a pod speak to a node agent.
//
// A node agent's certificate is in no object: the agent (qvirt-handler) makes an ECDSA P-256 key
// in memory when it starts and asks qvirt-controller to certify it with a
// CertificateSigningRequest of signer qvirt.io/handler (HandlerSignerName), sent with its pod's
// ServiceAccount token. kube-apiserver records who asked in the request: the user
// system:serviceaccount:qvirt-system:qvirt-handler and, because the token is bound to the pod, the
// pod's node in spec.extra["authentication.kubernetes.io/node-name"]. The controller approves and
// signs only when both are so and the request asks for exactly HandlerCSRTemplate of that node;
// otherwise it denies it, with the reason (WrongNode, TokenNotBoundToANode, NotANodeAgent,
// BadRequest) in the Denied condition, which the agent logs. The certificate has CN and DNS SAN
// qvirt-handler, the URI SAN qvirt-handler://NODE (HandlerNodeURI), serverAuth and clientAuth; it
// lives min(the 24 hours asked, the controller's leaf lifetime). No key is shared between nodes,
// so a compromised node can speak only for itself.
//
// # Who accepts whom
//
// The handler's stream server requires a client certificate that chains to the bundle and names
// qvirt-api (ServerConfig with allowed client qvirt-api). qvirt-api presents its tls.crt/tls.key
// and accepts a server whose chain verifies against its ca.crt, whose CN or DNS SAN is
// qvirt-handler and whose URI SAN names the node of the VMI it dials for (status.nodeName); a
// certificate for another node is refused with a WrongNodeError, which the user reads in a 503
// naming both nodes. The address dialled, a node IP from the node's qvirt.io/streams-address
// annotation, plays no part: the node name is the identity (and a redirected annotation leads
// nowhere). Between node agents the same holds both ways: the source's tunnel accepts only the
// migration's target node (HandlerClientConfig), and the target's endpoint takes a stream only
// from the migration's source node (qvirt-api's certificate is refused there). Nobody but the
// controller reads qvirt-ca (it holds the CA key); RBAC can limit qvirt-api to its Secret by name
// (resourceNames), since Source lists and watches with the field selector metadata.name.
//
// qvirt-api reads its Secret either with a Source (an informer on that one Secret; a change takes
// effect at the next handshake, within about a second) or from a mounted Secret volume (the
// kubelet refreshes the files within a minute or two).
//
// # Lifetimes and rotation
//
// Defaults: CA one year, qvirt-api's leaf and the serving leaves 30 days, node agents' leaves 24 hours, trust delay 10
// minutes (controllers/certs.Reconciler sets them). A certificate is replaced at 80% of its
// lifetime (RenewAt; a node agent at a random point between 70% and 90%, so the nodes do not all
// ask at once); qvirt-api's leaf also when it is not signed by the current CA, does not carry the
// wanted names or usages, or does not parse (then an Event of reason CertificateRepaired names the
// Secret and the key). A leaf never outlives its CA (Issue and Sign cut it). The controller
// requeues itself at the next deadline; it does not poll.
//
// CA rotation must not cut anyone off, so it happens in three steps, each reaching every peer
// before the next:
//
//  1. At 80% of the CA's lifetime (or when qvirt-ca is lost), the controller makes a new CA and
//     writes ca.crt = [new, old] into the Secrets and the bundle ConfigMap. Leaves stay signed by
//     the old CA. Peers pick up the bundle and now trust both.
//  2. After the trust delay (default 10 minutes, enough for Secret volumes to refresh), qvirt-api's
//     leaf is reissued by the new CA, and node agents, seeing a newer CA in the bundle than their
//     certificate's, ask again; the controller holds such requests until the trust delay has
//     passed. A peer that has not reloaded yet still presents its old leaf, which the others
//     accept, because the old CA is in their bundle.
//  3. One leaf lifetime after the rotation, no valid leaf of the old CA can exist: the old CA
//     leaves every bundle.
//
// The timeline for the defaults: day 0 CA1; day 292 CA2 made, bundles [CA2, CA1]; day 292 + 10
// minutes leaves from CA2; day 322 bundles [CA2]; CA1 would have expired on day 365.
//
// # Rotating by hand
//
// Delete the object; the controller recreates it at once (for a Secret, an Event of reason
// CertificateCreated says so).
//
//   - kubectl -n qvirt-system delete secret qvirt-api-certs: a new leaf from the same CA; nothing
//     else changes, peers accept it as soon as qvirt-api reloads.
//   - A node agent's certificate: restart the agent's pod (a new key, a new certificate).
//   - kubectl -n qvirt-system delete secret qvirt-ca: a CA rotation exactly as above (the old CA
//     is recovered from the bundles and kept for the overlap), for example after the CA key may
//     have leaked. The old CA stays trusted for the overlap (one leaf lifetime): there is no
//     immediate revocation; lower the leaf lifetime if that window matters.
//
// Earlier versions kept one serving certificate and key for all node agents in Secret
// qvirt-handler-certs; the controller deletes it (no peer accepts a certificate naming no node).
package certs
