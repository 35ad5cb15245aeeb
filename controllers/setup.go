// Package controllers wires qvirt-controller: the configuration, VM, VMI, migration and node health
// reconcilers and the admission webhooks (defaulting and validating), on one controller-runtime
// manager. The reconcilers live in the sub-packages named after what they reconcile.
package controllers

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/admission"
	certctl "github.com/qvirt/qvirt/controllers/certs"
	"github.com/qvirt/qvirt/controllers/migration"
	"github.com/qvirt/qvirt/controllers/nodehealth"
	"github.com/qvirt/qvirt/controllers/uninstall"
	"github.com/qvirt/qvirt/controllers/vm"
	"github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/internal/config"
)

// CacheOptions keep the manager's cache to what qvirt owns: launcher pods only (not every pod of
// the cluster) and the configuration ConfigMap's namespace only. This is most of the controller's
// memory per VMI.
func CacheOptions(namespace string) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:       {Label: labels.SelectorFromSet(labels.Set{v1alpha1.AppLabel: v1alpha1.LauncherApp})},
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{namespace: {}}},
			// Only the nodes a qvirt node agent labelled are cached (nodehealth reads their labels,
			// annotations and Ready condition).
			&corev1.Node{}: {Label: nodehealth.NodeSelector()},
			// Only the revisions qvirt pins instancetypes and preferences in, not every
			// StatefulSet's and DaemonSet's.
			&appsv1.ControllerRevision{}: {Label: vm.RevisionSelector()},
		},
		// Managed fields go, and launcher pods keep only what the controller reads from its cache.
		DefaultTransform: vmi.CacheTransform,
	}
}

// Options configure Setup.
type Options struct {
	// Namespace is the install namespace holding the qvirt-config ConfigMap.
	Namespace string
	// Webhooks registers the defaulting and validating webhooks on the manager's webhook server.
	Webhooks bool
	// NodeHeartbeatTimeout is how long a node agent may go without beating before its node is
	// marked unschedulable, and how long a node may stay not Ready before its instances are failed;
	// nodehealth.DefaultTimeout when zero.
	NodeHeartbeatTimeout time.Duration
}

// Setup loads the configuration and registers every reconciler (and the webhooks) with mgr.
//
// Every replica serves the webhooks and follows the configuration they read. The other
// reconcilers are set up (and their mistakes found) on every replica too, but what they add to the
// manager, their controllers, caches and field indexes, waits until this replica leads (as
// KubeVirt's virt-controller starts its informers in onStartedLeading): a field index or a cache
// registered at setup would have a replica that only waits to lead receive and decode every
// launcher pod, instance and migration event of the cluster, for nothing (0.4 CPU-seconds per 100
// started VMIs in BenchmarkStartup). The price is a takeover that first lists what it watches.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) (*config.Store, error) {
	store, err := initialConfig(ctx, mgr.GetAPIReader(), opts.Namespace)
	if err != nil {
		return nil, err
	}
	c, s := mgr.GetClient(), mgr.GetScheme()
	lead := &leaderOnly{Manager: mgr}
	everyReplica := []setupStep{
		{"config", func() error {
			return (&config.Reconciler{Client: c, Namespace: opts.Namespace, Store: store, Recorder: recorder(mgr, "qvirt-config")}).SetupWithManager(mgr)
		}},
	}
	if opts.Webhooks {
		everyReplica = append(everyReplica, setupStep{"webhook", func() error { return admission.Setup(mgr, store) }})
	}
	leading := []setupStep{
		{"vm", func() error {
			return (&vm.Reconciler{Client: c, Scheme: s, Recorder: recorder(mgr, "qvirt-vm"), Config: store, APIReader: mgr.GetAPIReader()}).SetupWithManager(lead)
		}},
		{"vmi", func() error {
			return (&vmi.Reconciler{Client: c, Scheme: s, Recorder: recorder(mgr, "qvirt-vmi"), Config: store, APIReader: mgr.GetAPIReader()}).SetupWithManager(lead)
		}},
		{"migration", func() error {
			return (&migration.Reconciler{Client: c, Scheme: s, Recorder: recorder(mgr, "qvirt-migration"), Config: store}).SetupWithManager(lead)
		}},
		{"evacuation", func() error {
			return (&migration.EvacuationReconciler{Client: c, Recorder: recorder(mgr, "qvirt-evacuation"), Config: store}).SetupWithManager(lead)
		}},
		{"nodehealth", func() error {
			return (&nodehealth.Reconciler{Client: c, Recorder: recorder(mgr, "qvirt-nodehealth"), Timeout: opts.NodeHeartbeatTimeout}).SetupWithManager(lead)
		}},
		{"uninstall", func() error { return (&uninstall.Reconciler{Client: c}).SetupWithManager(lead) }},
		{"certs", func() error {
			return (&certctl.Reconciler{Client: c, Namespace: opts.Namespace, Recorder: recorder(mgr, "qvirt-certs")}).SetupWithManager(lead)
		}},
	}
	if err := runSteps(append(everyReplica, leading...)); err != nil {
		return nil, err
	}
	if err := mgr.Add(onLeading(lead.register)); err != nil {
		return nil, err
	}
	return store, nil
}

// setupStep registers one reconciler or the webhooks.
type setupStep struct {
	name  string
	setup func() error
}

func runSteps(steps []setupStep) error {
	for _, step := range steps {
		if err := step.setup(); err != nil {
			return fmt.Errorf("set up %s: %w", step.name, err)
		}
	}
	return nil
}

// leaderOnly is the manager the leader's reconcilers are set up with. Their builders run (and fail)
// at setup, on every replica, but what they would add to the manager, and the field indexes they
// would register, are kept for register, once the replica leads. Each controller then starts with
// all of its watches in place, so it waits for their caches to sync before its workers run; a
// controller added to a started manager before its builder had added the watches would not.
type leaderOnly struct {
	ctrl.Manager
	runnables []manager.Runnable
	indexes   []fieldIndex
}

type fieldIndex struct {
	obj     client.Object
	field   string
	extract client.IndexerFunc
}

// Add keeps r for register.
func (l *leaderOnly) Add(r manager.Runnable) error {
	l.runnables = append(l.runnables, r)
	return nil
}

// GetFieldIndexer keeps the indexes registered for register.
func (l *leaderOnly) GetFieldIndexer() client.FieldIndexer { return (*leaderIndexer)(l) }

type leaderIndexer leaderOnly

func (l *leaderIndexer) IndexField(_ context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	l.indexes = append(l.indexes, fieldIndex{obj: obj, field: field, extract: extract})
	return nil
}

// register gives the manager, which has started, what the setup kept: the field indexes first,
// then the caches and controllers in the order they were added (a reconciler's own cache before
// the controller that watches it). The started manager starts each as it is added.
func (l *leaderOnly) register(ctx context.Context) error {
	for _, ix := range l.indexes {
		if err := l.Manager.GetFieldIndexer().IndexField(ctx, ix.obj, ix.field, ix.extract); err != nil {
			return fmt.Errorf("index %T by %s: %w", ix.obj, ix.field, err)
		}
	}
	for _, r := range l.runnables {
		if err := l.Manager.Add(r); err != nil {
			return fmt.Errorf("start %T: %w", r, err)
		}
	}
	return nil
}

// onLeading runs once the replica leads (at once without leader election).
type onLeading func(context.Context) error

func (f onLeading) Start(ctx context.Context) error { return f(ctx) }

func (onLeading) NeedLeaderElection() bool { return true }

// initialConfig reads the ConfigMap once before the cache starts, so the first reconciles already
// use it; a ConfigMap that does not parse stops the controller with the key named.
func initialConfig(ctx context.Context, r client.Reader, namespace string) (*config.Store, error) {
	var cm corev1.ConfigMap
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: config.ConfigMapName}, &cm)
	if apierrors.IsNotFound(err) {
		return config.NewStore(config.Default()), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", namespace, config.ConfigMapName, err)
	}
	c, err := config.Parse(cm.Data)
	if err != nil {
		return nil, err
	}
	return config.NewStore(c), nil
}

// recorder is the events recorder the reconcilers take. They record with the core/v1 Events API,
// which kubectl describe shows; the events.k8s.io recorder that replaces it takes a different
// interface, a move for all reconcilers at once.
func recorder(mgr ctrl.Manager, name string) record.EventRecorder {
	//lint:ignore SA1019 see above
	return mgr.GetEventRecorderFor(name)
}

// WebhookReady is the readiness of a replica serving the webhooks: started (the webhook server's
// started check, which fails until serving holds a certificate) is asked until it passes once,
// and not again. Its TLS handshake with the replica itself was most of an idle replica's CPU at a
// probe a second (local mode's endpoint publisher). Once it has passed it could not fail again: the
// server serves for the process's life, and a deleted or broken certificate Secret leaves the last
// good certificate in place (certs.Source). A stopping replica still turns not ready (drain).
func WebhookReady(started healthz.Checker) healthz.Checker {
	var passed atomic.Bool
	return func(req *http.Request) error {
		if passed.Load() {
			return nil
		}
		if err := started(req); err != nil {
			return err
		}
		passed.Store(true)
		return nil
	}
}
