// Package config is qvirt's cluster configuration: the ConfigMap qvirt-config in the install
// namespace, parsed strictly and applied without a restart. Readers call Store.Get on every use; the
// ConfigMap reconciler swaps the whole Config atomically when the ConfigMap changes.
//
// Both qvirt-controller and the node agent (handler/) run that reconciler, each keeping its own
// Store, which is why it lives outside controllers/: the node agent links no cluster reconciler.
package config

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// ConfigMapName is the name of the configuration ConfigMap in the install namespace.
const ConfigMapName = "qvirt-config"

// Config is qvirt's cluster configuration. The zero value is not valid: start from Default.
type Config struct {
	// UseEmulation runs guests under TCG and drops the /dev/kvm request; for clusters without
	// working KVM. Key: useEmulation ("true"/"false").
	UseEmulation bool
	// LauncherImage is the image of launcher pods. Key: launcherImage.
	LauncherImage string
	// Migrations are the live migration limits.
	Migrations MigrationConfig
	// MemoryOverhead is the launcher pod's memory on top of the guest's. Keys:
	// memoryOverheadBase (a quantity), memoryOverheadPerVCPU (a quantity), memoryOverheadGuestRatio
	// (guest memory divided by this, e.g. 512 adds 1 MiB per 512 MiB; 0 adds nothing).
	MemoryOverhead MemoryOverhead
	// AllowedHostPaths are the directories under which hostDisk volumes may lie; none when empty.
	// Each namespace has its own directory under each of them, <allowed path>/<namespace>, and an
	// instance's host disks must be inside its namespace's (HostDiskDir). Key: allowedHostPaths
	// (comma-separated absolute paths).
	AllowedHostPaths []string
	// HostDiskNamespaces are the namespaces whose instances may use hostDisk volumes; none when
	// empty. Key: hostDiskNamespaces (comma-separated namespace names).
	HostDiskNamespaces []string
	// InsecureRegistries are registries (host:port) launchers may pull from over plain HTTP, such
	// as local mode's. Key: insecureRegistries (comma-separated).
	InsecureRegistries []string
	// VMStateStorageClass is the StorageClass of the backend-storage claims that hold persistent
	// TPM and EFI state (v1alpha1.BackendStorageClaim); the cluster's default when "". Key:
	// vmStateStorageClass, as KubeVirt's.
	VMStateStorageClass string
	// EvictionStrategy is what a drain does to instances whose spec.evictionStrategy is unset
	// (KubeVirt's spec.configuration.evictionStrategy): None, LiveMigrate, LiveMigrateIfPossible
	// or External; empty is None. Key: evictionStrategy.
	EvictionStrategy v1alpha1.EvictionStrategy
	// EnableVirtiofs admits instances with virtiofs filesystems. Off by default, as KubeVirt's
	// virtiofs feature gates: their launcher pods run without a seccomp profile, since QEMU 7.2's
	// virtiofsd can sandbox itself unprivileged only in a user namespace of its own, which the
	// runtime's default profile forbids; a tenant who execs into such a pod reaches more of the
	// node's kernel. Key: enableVirtiofs.
	EnableVirtiofs bool
	// EnablePasstBinding admits instances with the passt binding. Off by default, as KubeVirt
	// needs its passt plugin registered: their launcher pods run without a seccomp profile, since
	// passt sandboxes itself in a user namespace of its own (as virtiofsd does). Key:
	// enablePasstBinding.
	EnablePasstBinding bool
	// EnableDownwardMetrics admits instances with devices.downwardMetrics. Off by default, as
	// KubeVirt's DownwardMetrics feature gate: the port shows the guest its node's free memory and
	// CPU time, which other tenants' load moves. Key: enableDownwardMetrics.
	EnableDownwardMetrics bool
	// LauncherCPUProfile makes every new launcher write a CPU profile of its start
	// (podlayout.ProfileFile in its socket directory), for `make profile`; off by default. Key:
	// launcherCPUProfile.
	LauncherCPUProfile bool
}

// EvictionStrategyFor is the eviction strategy in force for an instance: its own, else the
// cluster's, else None (KubeVirt's migrations.VMIEvictionStrategy).
func (c Config) EvictionStrategyFor(spec *v1alpha1.VirtualMachineInstanceSpec) v1alpha1.EvictionStrategy {
	switch {
	case spec.EvictionStrategy != nil:
		return *spec.EvictionStrategy
	case c.EvictionStrategy != "":
		return c.EvictionStrategy
	}
	return v1alpha1.EvictionStrategyNone
}

// MigrationConfig limits live migrations.
type MigrationConfig struct {
	// ParallelPerCluster is how many migrations run at once in the cluster. Key:
	// parallelMigrationsPerCluster.
	ParallelPerCluster int
	// ParallelOutboundPerNode is how many migrations leave one node at once. Key:
	// parallelOutboundMigrationsPerNode.
	ParallelOutboundPerNode int
	// BandwidthPerMigration caps each migration's bandwidth in bytes per second; 0 is QEMU's
	// default. Key: bandwidthPerMigration (a quantity such as 64Mi).
	BandwidthPerMigration resource.Quantity
	// CompletionTimeoutPerGiB is how many seconds a migration may take per GiB of guest memory
	// before it is cancelled. Key: completionTimeoutPerGiB.
	CompletionTimeoutPerGiB int64
	// ProgressTimeout is how many seconds a migration may go without progress (the memory still
	// to send never falling below its lowest so far) before the source launcher aborts it; 0
	// never does. KubeVirt's migrations.progressTimeout, with its default of 150. Key:
	// progressTimeout.
	ProgressTimeout int64
}

// MemoryOverhead is the formula for a launcher pod's memory beyond the guest:
// Base + PerVCPU*vCPUs + guest/GuestRatio.
type MemoryOverhead struct {
	Base       resource.Quantity
	PerVCPU    resource.Quantity
	GuestRatio int64
}

// Default is the configuration used when the ConfigMap is absent; KubeVirt's migration defaults.
// The overhead is measured, not copied: a running launcher holds about 14 MiB RSS and QEMU about
// 50 MiB beyond guest RAM, so 96 MiB leaves room (emulation's translation cache is counted apart:
// vmi.MemoryOverhead); KubeVirt's 240 MiB base carries libvirt, virtlogd and virt-launcher's
// monitor, which qvirt does not have.
func Default() Config {
	return Config{
		LauncherImage: "localhost:5000/qvirt/qvirt-launcher:latest",
		Migrations: MigrationConfig{
			ParallelPerCluster: 5, ParallelOutboundPerNode: 2,
			BandwidthPerMigration: resource.MustParse("0"), CompletionTimeoutPerGiB: 150,
			ProgressTimeout: 150,
		},
		MemoryOverhead: MemoryOverhead{
			Base: resource.MustParse("96Mi"), PerVCPU: resource.MustParse("4Mi"), GuestRatio: 512,
		},
	}
}

// Parse reads a ConfigMap's data over the defaults. Unknown keys and bad values are errors naming
// the key: a typo must not silently fall back to a default.
func Parse(data map[string]string) (Config, error) {
	c := Default()
	p := field.NewPath("data")
	var errs field.ErrorList
	for key, val := range data {
		if err := c.set(key, strings.TrimSpace(val)); err != nil {
			errs = append(errs, field.Invalid(p.Key(key), val, err.Error()))
		}
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("configmap %s: %w", ConfigMapName, errs.ToAggregate())
	}
	return c, nil
}

func (c *Config) set(key, val string) error {
	var err error
	switch key {
	case "useEmulation":
		c.UseEmulation, err = strconv.ParseBool(val)
	case "launcherImage":
		if val == "" {
			return fmt.Errorf("must name an image")
		}
		c.LauncherImage = val
	case "parallelMigrationsPerCluster":
		c.Migrations.ParallelPerCluster, err = positiveInt(val)
	case "parallelOutboundMigrationsPerNode":
		c.Migrations.ParallelOutboundPerNode, err = positiveInt(val)
	case "bandwidthPerMigration":
		c.Migrations.BandwidthPerMigration, err = nonNegativeQuantity(val)
	case "completionTimeoutPerGiB":
		var n int
		n, err = positiveInt(val)
		c.Migrations.CompletionTimeoutPerGiB = int64(n)
	case "progressTimeout":
		c.Migrations.ProgressTimeout, err = strconv.ParseInt(val, 10, 64)
		if err == nil && (c.Migrations.ProgressTimeout < 0 || c.Migrations.ProgressTimeout > 7*24*3600) {
			err = fmt.Errorf("must be 0 (never) or a number of seconds up to 604800 (a week)")
		}
	case "memoryOverheadBase":
		c.MemoryOverhead.Base, err = nonNegativeQuantity(val)
	case "memoryOverheadPerVCPU":
		c.MemoryOverhead.PerVCPU, err = nonNegativeQuantity(val)
	case "memoryOverheadGuestRatio":
		c.MemoryOverhead.GuestRatio, err = strconv.ParseInt(val, 10, 64)
		if err == nil && c.MemoryOverhead.GuestRatio < 0 {
			err = fmt.Errorf("must be 0 or more")
		}
	case "allowedHostPaths":
		c.AllowedHostPaths, err = hostPaths(val)
	case "hostDiskNamespaces":
		c.HostDiskNamespaces, err = namespaces(val)
	case "insecureRegistries":
		c.InsecureRegistries, err = registries(val)
	case "vmStateStorageClass":
		if msgs := validation.IsDNS1123Subdomain(val); val != "" && len(msgs) > 0 {
			return fmt.Errorf("must be a StorageClass name: %s", strings.Join(msgs, "; "))
		}
		c.VMStateStorageClass = val
	case "evictionStrategy":
		c.EvictionStrategy, err = evictionStrategy(val)
	case "enableVirtiofs":
		c.EnableVirtiofs, err = strconv.ParseBool(val)
	case "enablePasstBinding":
		c.EnablePasstBinding, err = strconv.ParseBool(val)
	case "enableDownwardMetrics":
		c.EnableDownwardMetrics, err = strconv.ParseBool(val)
	case "launcherCPUProfile":
		c.LauncherCPUProfile, err = strconv.ParseBool(val)
	default:
		return fmt.Errorf("unknown key; known keys are useEmulation, launcherImage, parallelMigrationsPerCluster, " +
			"parallelOutboundMigrationsPerNode, bandwidthPerMigration, completionTimeoutPerGiB, progressTimeout, memoryOverheadBase, " +
			"memoryOverheadPerVCPU, memoryOverheadGuestRatio, allowedHostPaths, hostDiskNamespaces, insecureRegistries, vmStateStorageClass, evictionStrategy, enableVirtiofs, enablePasstBinding, enableDownwardMetrics, launcherCPUProfile")
	}
	return err
}

func evictionStrategy(s string) (v1alpha1.EvictionStrategy, error) {
	switch es := v1alpha1.EvictionStrategy(s); es {
	case "", v1alpha1.EvictionStrategyNone, v1alpha1.EvictionStrategyLiveMigrate,
		v1alpha1.EvictionStrategyLiveMigrateIfPossible, v1alpha1.EvictionStrategyExternal:
		return es, nil
	}
	return "", fmt.Errorf("must be None, LiveMigrate, LiveMigrateIfPossible or External")
}

func positiveInt(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("must be a whole number of 1 or more")
	}
	return n, nil
}

func nonNegativeQuantity(s string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return q, err
	}
	if q.Sign() < 0 {
		return q, fmt.Errorf("must not be negative")
	}
	return q, nil
}

func hostPaths(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return nil, fmt.Errorf("%q must be a clean absolute path", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// HostDiskDirs are the host directories namespace's instances may take hostDisk images from:
// <allowed path>/<namespace> for each allowed path, none when the namespace is not one of
// HostDiskNamespaces.
func (c Config) HostDiskDirs(namespace string) []string {
	if namespace == "" || !slices.Contains(c.HostDiskNamespaces, namespace) {
		return nil
	}
	out := make([]string, 0, len(c.AllowedHostPaths))
	for _, dir := range c.AllowedHostPaths {
		out = append(out, filepath.Join(dir, namespace))
	}
	return out
}

// HostDiskDir is the directory of HostDiskDirs(namespace) that path lies strictly under, and
// whether there is one. path must be clean: "/a/./b" or "/a//b" name no directory's file here.
func (c Config) HostDiskDir(namespace, path string) (string, bool) {
	if filepath.Clean(path) != path {
		return "", false
	}
	for _, dir := range c.HostDiskDirs(namespace) {
		if strings.HasPrefix(path, dir+"/") {
			return dir, true
		}
	}
	return "", false
}

// Store holds the configuration in force. Safe for concurrent use.
type Store struct {
	v atomic.Pointer[Config]
}

// NewStore returns a store holding c.
func NewStore(c Config) *Store {
	s := &Store{}
	s.Set(c)
	return s
}

// Get returns the configuration in force.
func (s *Store) Get() Config { return *s.v.Load() }

// Set replaces the configuration.
func (s *Store) Set(c Config) { s.v.Store(&c) }

// Reconciler keeps a Store in step with the ConfigMap. A ConfigMap that does not parse keeps the
// previous configuration and produces a Warning event naming the bad key.
type Reconciler struct {
	Client    client.Client
	Namespace string
	Store     *Store
	Recorder  record.EventRecorder
}

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile applies the ConfigMap's current content.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var cm corev1.ConfigMap
	err := r.Client.Get(ctx, req.NamespacedName, &cm)
	if apierrors.IsNotFound(err) {
		r.Store.Set(Default())
		log.Info("configuration ConfigMap absent; using defaults")
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	c, err := Parse(cm.Data)
	if err != nil {
		log.Error(err, "configuration refused; keeping the previous one")
		if r.Recorder != nil {
			r.Recorder.Eventf(&cm, corev1.EventTypeWarning, "InvalidConfiguration", "%v", err)
		}
		return ctrl.Result{}, nil
	}
	r.Store.Set(c)
	log.Info("configuration applied", "useEmulation", c.UseEmulation, "launcherImage", c.LauncherImage)
	return ctrl.Result{}, nil
}

// SetupWithManager watches only the qvirt-config ConfigMap of the install namespace. It runs on
// every replica, not only the leader: each replica serves the admission webhooks, which read the
// Store (hostDisk's allowed paths, useEmulation, the virtiofs and downward metrics gates), so a
// replica that kept the configuration it started with would admit or refuse by stale settings.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	only := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetName() == ConfigMapName && o.GetNamespace() == r.Namespace
	})
	everyReplica := false
	return ctrl.NewControllerManagedBy(mgr).Named("config").
		WithOptions(controller.Options{NeedLeaderElection: &everyReplica}).
		For(&corev1.ConfigMap{}, builder.WithPredicates(only)).Complete(r)
}

// namespaces parses a comma-separated list of namespace names.
func namespaces(s string) ([]string, error) {
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			return nil, fmt.Errorf("%q is not a namespace name: %s", n, strings.Join(msgs, "; "))
		}
		out = append(out, n)
	}
	return out, nil
}

// registries parses a comma-separated list of registry host:port addresses.
func registries(s string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		host, port, err := net.SplitHostPort(r)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%q is not a registry host:port", r)
		}
		out = append(out, r)
	}
	return out, nil
}
