// Package cdi installs stand-ins of CDI's CRDs (DataVolume, DataSource; the YAML files here) into a
// test's control plane, so that tests can play CDI without running it.
package cdi

import (
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/qvirt/qvirt/test/envtest"
)

// InstallCRDs installs the stand-ins into the control plane at cfg and uninstalls them when the
// test ends.
func InstallCRDs(t testing.TB, cfg *rest.Config) {
	t.Helper()
	dir := filepath.Join(envtest.RepoRoot(), "test", "cdi")
	crds, err := crenvtest.InstallCRDs(cfg, crenvtest.CRDInstallOptions{
		Paths: []string{filepath.Join(dir, "datavolume-crd.yaml"), filepath.Join(dir, "datasource-crd.yaml")}, ErrorIfPathMissing: true})
	if err != nil {
		t.Fatalf("install CDI's CRDs: %v", err)
	}
	t.Cleanup(func() {
		if err := crenvtest.UninstallCRDs(cfg, crenvtest.CRDInstallOptions{CRDs: crds}); err != nil {
			t.Errorf("uninstall CDI's CRDs: %v", err)
		}
	})
}
