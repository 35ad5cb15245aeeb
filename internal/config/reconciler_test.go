package config_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConfigMapIsAppliedWithoutRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "qvirt-system"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	store := config.NewStore(config.Default())
	//lint:ignore SA1019 the reconcilers take a core/v1 events recorder (see controllers/setup.go)
	r := &config.Reconciler{Client: mgr.GetClient(), Namespace: ns, Store: store, Recorder: mgr.GetEventRecorderFor("qvirt-config")}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: ns},
		Data: map[string]string{"useEmulation": "true", "parallelMigrationsPerCluster": "3"}}
	if err := cp.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "useEmulation to apply", func() bool { c := store.Get(); return c.UseEmulation && c.Migrations.ParallelPerCluster == 3 })

	cm.Data = map[string]string{"useEmulation": "false", "launcherImage": "reg/launcher:2"}
	if err := cp.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the update to apply", func() bool { c := store.Get(); return !c.UseEmulation && c.LauncherImage == "reg/launcher:2" })

	// A bad value keeps the configuration in force and says why on the ConfigMap.
	cm.Data = map[string]string{"useEmulation": "sometimes"}
	if err := cp.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Warning event naming the key", func() bool {
		var evs corev1.EventList
		_ = cp.Client.List(ctx, &evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			if e.Reason == "InvalidConfiguration" && e.InvolvedObject.Name == config.ConfigMapName && strings.Contains(e.Message, "data[useEmulation]") {
				return true
			}
		}
		return false
	})
	if c := store.Get(); c.LauncherImage != "reg/launcher:2" {
		t.Fatalf("a refused ConfigMap changed the configuration: %+v", c)
	}

	// Deleting the ConfigMap returns to the defaults.
	if err := cp.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the defaults", func() bool { return store.Get().LauncherImage == config.Default().LauncherImage })
}
