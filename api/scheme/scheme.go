// Package scheme builds the runtime.Scheme qvirt's binaries and tests share: client-go's built-in
// kinds and qvirt.io/v1alpha1. It lives here, beside the types, so that a binary needing a client
// (the node agent, the local cluster) does not link the cluster reconcilers to get one.
package scheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// New returns a scheme knowing client-go's kinds (pods, nodes, ConfigMaps, ...) and qvirt.io/v1alpha1.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("register client-go's kinds: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("register %s: %w", v1alpha1.GroupVersion, err)
	}
	return s, nil
}

// NewClient is a controller-runtime client with this scheme, as the user of kubeconfig.
func NewClient(kubeconfig string) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	s, err := New()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}
