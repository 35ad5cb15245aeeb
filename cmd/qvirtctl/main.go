// Command qvirtctl drives qvirt: lifecycle actions, console, VNC, QMP shell, migration and hotplug
// of virtual machines through qvirt-api, and `qvirtctl local up|down|status`, a whole cluster on
// this machine. Linked as kubectl-qvirt it is also the kubectl plugin `kubectl qvirt`.
package main

import (
	"os"

	"github.com/qvirt/qvirt/cli"
)

func main() {
	os.Exit(cli.Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
