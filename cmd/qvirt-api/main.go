// Command qvirt-api is the aggregated API server of subresources.qvirt.io: console, VNC and QMP
// streams and the VM and VMI actions, behind kube-apiserver (APIService
// v1alpha1.subresources.qvirt.io). See package apiserver.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/qvirt/qvirt/apiserver"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/internal/buildinfo"
)

func main() {
	opts := apiserver.NewOptions()
	fs := pflag.NewFlagSet("qvirt-api", pflag.ExitOnError)
	opts.AddFlags(fs)
	version := fs.Bool("version", false, "print the version as JSON and exit")
	secret := fs.String("handler-tls-secret", "", "Secret (in --namespace) with qvirt-api's client certificate for the handlers and their CA bundle, kept by qvirt-controller (e.g. "+certs.APISecret+"); instead of the --handler-*-file flags")
	servingSecret := fs.String("tls-secret", "", "Secret (in --namespace) with qvirt-api's serving certificate, kept by qvirt-controller (e.g. "+certs.APIServingSecret+"); instead of --tls-cert-file and --tls-private-key-file")
	namespace := fs.String("namespace", envOr("POD_NAMESPACE", "qvirt-system"), "install namespace, holding --handler-tls-secret")
	zapOpts := zap.Options{}
	goFlags := flag.NewFlagSet("qvirt-api", flag.ExitOnError)
	zapOpts.BindFlags(goFlags)
	fs.AddGoFlagSet(goFlags)
	_ = fs.Parse(os.Args[1:])
	if *version {
		out, _ := json.Marshal(buildinfo.Version())
		fmt.Println(string(out))
		return
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	klog.SetLogger(log.WithName("apiserver"))
	opts.Log = log.WithName("qvirt-api")
	ctx := ctrl.SetupSignalHandler()
	if *secret != "" {
		tlsCfg, err := secretTLS(ctx, opts.Kubeconfig, *namespace, *secret)
		if err != nil {
			log.Error(err, "qvirt-api: --handler-tls-secret")
			os.Exit(1)
		}
		opts.HandlerTLS = func() (*tls.Config, error) { return tlsCfg, nil }
	}
	if *servingSecret != "" {
		src, err := secretSource(opts.Kubeconfig, *namespace, *servingSecret)
		if err != nil {
			log.Error(err, "qvirt-api: --tls-secret")
			os.Exit(1)
		}
		go func() { _ = src.Start(ctx) }()
		opts.ServingCert = apiserver.NewSecretServingCert(src)
	}
	api, err := apiserver.New(opts)
	if err != nil {
		log.Error(err, "qvirt-api: configuration")
		os.Exit(1)
	}
	if err := api.Run(ctx); err != nil {
		log.Error(err, "qvirt-api failed")
		os.Exit(1)
	}
}

// secretTLS watches the Secret and returns a client configuration that always uses its current
// certificate and CA bundle (certs.ClientConfig reads the source at every handshake).
func secretTLS(ctx context.Context, kubeconfig, namespace, name string) (*tls.Config, error) {
	src, err := secretSource(kubeconfig, namespace, name)
	if err != nil {
		return nil, err
	}
	go func() { _ = src.Start(ctx) }()
	return certs.ClientConfig(src, certs.HandlerName), nil
}

// secretSource watches Secret namespace/name with qvirt-api's own credentials once started.
func secretSource(kubeconfig, namespace, name string) (*certs.Source, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return certs.NewSource(cs, namespace, name), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
