// Command qvirt-pod-init is the first process of each container on a local cluster's virtual
// nodes (see local/podinit).
package main

import (
	"fmt"
	"os"

	"github.com/qvirt/qvirt/local/podinit"
)

func main() {
	err := podinit.Main(os.Args[1:])
	fmt.Fprintln(os.Stderr, "qvirt-pod-init:", err)
	os.Exit(127)
}
