// Command qvirtctl drives qvirt: lifecycle actions, console, VNC, QMP shell, migration and hotplug
// of virtual machines through qvirt-api, and `qvirtctl local up|down|status`, a whole cluster on
// this machine, which execs qvirt-local (cmd/qvirt-local). Linked as kubectl-qvirt it is also the
// kubectl plugin `kubectl qvirt`.
package main

import (
	"os"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/cli"
)

func main() {
	// qvirtctl reports errors itself; without a logger controller-runtime's client prints a
	// stack trace to stderr 30 s into a long command (vnc, migrate --wait).
	ctrllog.SetLogger(logr.Discard())
	os.Exit(cli.Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
