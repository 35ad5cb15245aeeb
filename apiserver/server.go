package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	basecompatibility "k8s.io/component-base/compatibility"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
)

// DefaultPort is where qvirt-api listens; its Service maps 443 to it.
const DefaultPort = 8443

// Options configure qvirt-api. The serving, authentication and authorization options are
// k8s.io/apiserver's own, with their usual flags (--secure-port, --tls-cert-file,
// --authentication-kubeconfig, --authorization-kubeconfig, --requestheader-*, ...).
type Options struct {
	SecureServing  *genericoptions.SecureServingOptionsWithLoopback
	Authentication *genericoptions.DelegatingAuthenticationOptions
	Authorization  *genericoptions.DelegatingAuthorizationOptions

	// Kubeconfig is qvirt-api's own client configuration (VMIs, VMs, nodes, migrations); empty
	// means in-cluster.
	Kubeconfig string

	// The handler client certificate, its key and the CA of handler serving certificates, as PEM
	// files; ignored when HandlerTLS is set.
	HandlerClientCertFile, HandlerClientKeyFile, HandlerCAFile string
	// HandlerTLS, when set, gives the TLS configuration of every dial to a handler (for a
	// Secret-backed source).
	HandlerTLS TLSConfigSource
	// ServingCert, when set, replaces --tls-cert-file and --tls-private-key-file (a
	// SecretServingCert).
	ServingCert dynamiccertificates.CertKeyContentProvider

	// PingInterval is how often both sides of a stream are pinged (30 s when zero); a side that
	// does not answer within PingTimeout (15 s when zero) ends the stream.
	PingInterval, PingTimeout time.Duration

	// Log receives the stream and action lines (user, groups, VMI, QMP commands).
	Log logr.Logger
}

// NewOptions are the defaults: port 8443, a self-signed certificate unless --tls-cert-file is
// given, delegated authentication and authorization.
func NewOptions() *Options {
	ss := genericoptions.NewSecureServingOptions()
	ss.BindPort = DefaultPort
	ss.ServerCert.CertDirectory = "" // self-signed certificates stay in memory
	ss.ServerCert.PairName = "qvirt-api"
	return &Options{
		SecureServing:  ss.WithLoopback(),
		Authentication: genericoptions.NewDelegatingAuthenticationOptions(),
		Authorization:  genericoptions.NewDelegatingAuthorizationOptions(),
	}
}

// AddFlags registers every option's flag.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.SecureServing.AddFlags(fs)
	o.Authentication.AddFlags(fs)
	o.Authorization.AddFlags(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig of qvirt-api's own client; in-cluster configuration when empty")
	fs.StringVar(&o.HandlerClientCertFile, "handler-client-cert-file", o.HandlerClientCertFile, "PEM client certificate qvirt-api presents to qvirt-handlers")
	fs.StringVar(&o.HandlerClientKeyFile, "handler-client-key-file", o.HandlerClientKeyFile, "PEM key of --handler-client-cert-file")
	fs.StringVar(&o.HandlerCAFile, "handler-ca-file", o.HandlerCAFile, "PEM CA bundle that signs qvirt-handler serving certificates (which must name "+HandlerServerName+" and, in a "+certs.HandlerNodeScheme+":// URI, the node of the VMI dialled for)")
	fs.DurationVar(&o.PingInterval, "stream-ping-interval", o.PingInterval, "websocket keep-alive ping interval (30s when 0)")
}

// Validate checks the options; every error names its flag.
func (o *Options) Validate() error {
	var errs []error
	errs = append(errs, o.SecureServing.Validate()...)
	errs = append(errs, o.Authentication.Validate()...)
	errs = append(errs, o.Authorization.Validate()...)
	if o.HandlerTLS == nil {
		for _, f := range []struct{ flag, v string }{
			{"--handler-client-cert-file", o.HandlerClientCertFile}, {"--handler-client-key-file", o.HandlerClientKeyFile}, {"--handler-ca-file", o.HandlerCAFile},
		} {
			if f.v == "" {
				errs = append(errs, fmt.Errorf("%s is required", f.flag))
			}
		}
	}
	return errors.Join(errs...)
}

// API is a configured qvirt-api, ready to Run.
type API struct {
	opts       Options
	client     client.Client
	authorizer authorizer.Authorizer
	tls        TLSConfigSource
	log        logr.Logger
	server     *genericapiserver.GenericAPIServer
}

// New checks the options, builds the generic API server with the group installed, and returns it
// without serving.
func New(o *Options) (*API, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	a := &API{opts: *o, log: o.Log, tls: o.HandlerTLS}
	if a.opts.PingInterval <= 0 {
		a.opts.PingInterval = 30 * time.Second
	}
	if a.opts.PingTimeout <= 0 {
		a.opts.PingTimeout = 15 * time.Second
	}
	if a.tls == nil {
		a.tls = FileTLSConfig(o.HandlerClientCertFile, o.HandlerClientKeyFile, o.HandlerCAFile)
	}
	if _, err := a.tls(); err != nil {
		return nil, err
	}
	c, err := newClient(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	a.client = c
	cfg, err := o.config()
	if err != nil {
		return nil, err
	}
	a.authorizer = cfg.Authorization.Authorizer
	srv, err := cfg.Complete(nil).New("qvirt-api", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("generic API server: %w", err)
	}
	info := a.apiGroupInfo()
	if err := srv.InstallAPIGroup(&info); err != nil {
		return nil, fmt.Errorf("install %s: %w", sub.GroupVersion, err)
	}
	if err := installVersion(srv); err != nil {
		return nil, err
	}
	a.server = srv
	return a, nil
}

// config is the generic server's configuration: serving, delegated authn/authz, OpenAPI, and the
// stream subresources marked long-running (no request timeout).
func (o *Options) config() (*genericapiserver.Config, error) {
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	cfg := genericapiserver.NewConfig(codecs)
	if err := o.SecureServing.ApplyTo(&cfg.SecureServing, &cfg.LoopbackClientConfig); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	if o.ServingCert != nil {
		cfg.SecureServing.Cert = o.ServingCert
	}
	if err := o.Authentication.ApplyTo(&cfg.Authentication, cfg.SecureServing, nil); err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	if err := o.Authorization.ApplyTo(&cfg.Authorization); err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	cfg.EffectiveVersion = basecompatibility.NewEffectiveVersionFromString("1.37", "", "")
	namer := openapinamer.NewDefinitionNamer(scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title, cfg.OpenAPIConfig.Info.Version = "qvirt-api", sub.GroupVersion.Version
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title, cfg.OpenAPIV3Config.Info.Version = "qvirt-api", sub.GroupVersion.Version
	cfg.LongRunningFunc = genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch"), sets.NewString(streamSubresources...))
	return cfg, nil
}

func newClient(kubeconfig string) (client.Client, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("client configuration (--kubeconfig %q): %w", kubeconfig, err)
	}
	s := k8sruntime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// Run serves until ctx ends.
func (a *API) Run(ctx context.Context) error {
	return a.server.PrepareRun().RunWithContext(ctx)
}
