// Package handler assembles qvirt-handler, the node agent (a DaemonSet on a real cluster): a
// controller-runtime manager whose cache holds only its node's instances and launcher pods, the
// node-side reconciler (controllers/node) and the node's other duties.
package handler

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/node"
)

// Options configure the node agent.
type Options struct {
	// NodeName is the node this agent serves (the pod's spec.nodeName, from the downward API).
	NodeName string
	// SocketDir is where launchers make their per-instance directories (v1alpha1.SocketDir).
	SocketDir string
}

// CacheOptions restrict the cache to one node: instances whose status.nodeName is the node (a CRD
// selectable field, so the API server filters) and launcher pods scheduled there. Nothing
// cluster-wide is listed or watched.
func CacheOptions(nodeName string) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.VirtualMachineInstance{}: {Field: fields.OneTermEqualSelector("status.nodeName", nodeName)},
			&corev1.Pod{}: {
				Field: fields.OneTermEqualSelector("spec.nodeName", nodeName),
				Label: labels.SelectorFromSet(labels.Set{v1alpha1.AppLabel: v1alpha1.LauncherApp}),
			},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// Setup registers the node agent's parts with mgr, whose cache must be CacheOptions(opts.NodeName).
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.NodeName == "" {
		return fmt.Errorf("node name: required (flag --node-name or env NODE_NAME)")
	}
	if opts.SocketDir == "" {
		return fmt.Errorf("socket directory: required")
	}
	//lint:ignore SA1019 the reconcilers record with the core/v1 Events API, as qvirt-controller's
	rec := mgr.GetEventRecorderFor("qvirt-handler")
	r := &node.Reconciler{Client: mgr.GetClient(), Recorder: rec, NodeName: opts.NodeName, SocketDir: opts.SocketDir}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the instance reconciler: %w", err)
	}
	return nil
}
