// Command qvirt-local runs a whole qvirt cluster on this machine: `qvirt-local up|down|status`.
// Users run it as `qvirtctl local ...`, which execs this binary from beside qvirtctl (or PATH); it
// is separate so that qvirtctl links neither the local cluster (virtual-kubelet, the control
// plane's supervisor) nor the reconcilers.
package main

import (
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/local/localcli"
)

func main() {
	// As in qvirtctl, which ran these commands before: the demo's controller-runtime client would
	// print a stack trace to stderr 30 s into `up` without a logger.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(localcli.Main(os.Args, os.Stdout, os.Stderr))
}
