// Package scheme builds the runtime.Scheme qvirt's binaries and tests share: client-go's built-in
// kinds and qvirt.io/v1alpha1. It lives here, beside the types, so that a binary needing a client
// (the node agent, the local cluster) does not link the cluster reconcilers to get one.
package scheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

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
