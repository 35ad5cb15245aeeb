// Package layout checks the dependency rules of DESIGN.md (Layout) on the binaries as built: what
// each one links, not what its author meant it to.
package layout

import (
	"os/exec"
	"strings"
	"testing"
)

// deps lists every package pkg links.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// forbid fails for each package pkg links whose path starts with one of prefixes.
func forbid(t *testing.T, pkg string, prefixes ...string) {
	t.Helper()
	for _, d := range deps(t, pkg) {
		for _, p := range prefixes {
			if strings.HasPrefix(d, p) {
				t.Errorf("%s links %s (nothing under %s may be linked)", pkg, d, p)
			}
		}
	}
}

// The launcher speaks only the machine description: it links no Kubernetes package, so an API
// field is never a wire change and the per-VM process stays small.
func TestLauncherLinksNoKubernetes(t *testing.T) {
	forbid(t, "github.com/qvirt/qvirt/cmd/qvirt-launcher", "k8s.io/", "sigs.k8s.io/", "github.com/qvirt/qvirt/api/")
}

// The launcher's command socket speaks HTTP through launcher/wire, not net/http: net/http links
// crypto/tls, x509 and HTTP/2, 3.3 MiB of the launcher's mapped binary and most of its resident
// memory beyond its own (BenchmarkLauncherRSS).
func TestLauncherLinksNoHTTPStack(t *testing.T) {
	forbid(t, "github.com/qvirt/qvirt/cmd/qvirt-launcher", "net/http", "crypto/tls", "crypto/x509")
}

// qvirtctl is a client: it links no reconciler and not the local cluster (qvirt-local runs that).
func TestQvirtctlLinksNoReconcilerNorLocalCluster(t *testing.T) {
	forbid(t, "github.com/qvirt/qvirt/cmd/qvirtctl", "github.com/qvirt/qvirt/controllers", "github.com/qvirt/qvirt/local/",
		"github.com/virtual-kubelet/")
}

// The node agent is all in handler/: it links no cluster reconciler, so the two binaries' code
// (and their RBAC) cannot grow into each other. What both need is in api/, internal/ or
// launcher/podlayout.
func TestHandlerLinksNoClusterReconciler(t *testing.T) {
	for _, pkg := range []string{"github.com/qvirt/qvirt/handler/...", "github.com/qvirt/qvirt/cmd/qvirt-handler"} {
		forbid(t, pkg, "github.com/qvirt/qvirt/controllers")
	}
}

// The wire contract between the node agent and launchers (the machine description and the command
// protocol) is standard library only: both sides link it, and launchers of several versions
// speak it with one node agent.
func TestWireContractIsStandardLibraryOnly(t *testing.T) {
	for _, pkg := range []string{"github.com/qvirt/qvirt/machine", "github.com/qvirt/qvirt/launcher/protocol"} {
		for _, d := range deps(t, pkg) {
			if strings.Contains(strings.SplitN(d, "/", 2)[0], ".") && !strings.HasPrefix(d, "github.com/qvirt/qvirt/machine") &&
				!strings.HasPrefix(d, "github.com/qvirt/qvirt/launcher/protocol") {
				t.Errorf("%s links %s: the wire contract may link only the standard library", pkg, d)
			}
		}
	}
}
