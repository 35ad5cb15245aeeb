// Command qvirtctl drives qvirt: today `qvirtctl local up|down|status`, a whole cluster on this
// machine.
package main

import (
	"os"

	"github.com/qvirt/qvirt/cli"
)

func main() {
	if err := cli.NewRoot().Execute(); err != nil {
		os.Exit(1)
	}
}
