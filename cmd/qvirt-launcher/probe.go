package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// probe is `qvirt-launcher probe --guest-agent-ping`, the exec probe the launcher pod's compute
// container carries for a guestAgentPing probe (KubeVirt's virt-probe): it asks this pod's own
// launcher, over its command socket, to ping the guest agent. Exit 0 when the agent answered, 1
// (with the reason, which the kubelet puts in its Unhealthy Event) otherwise, 2 for bad flags. It
// runs in the tenant's own pod, as the pod's user, and reaches nothing the pod's user cannot.
func probe(args []string) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	socketDir := fs.String(podlayout.FlagSocketDir, podlayout.SocketDir, "the pod's socket directory")
	uid := fs.String(podlayout.FlagVMIUID, "", "UID of the VirtualMachineInstance this pod runs (required)")
	ping := fs.Bool(podlayout.FlagGuestAgentPing, false, "ping the guest agent (required: the only probe)")
	timeout := fs.Duration(podlayout.FlagProbeTimeout, time.Second, "how long the guest agent may take to answer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *uid == "" || !*ping || *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "qvirt-launcher probe: --vmi-uid, --guest-agent-ping and a positive --timeout are required")
		return 2
	}
	c := launcher.NewClient(launcher.VMIDir(*socketDir, *uid).Command())
	if err := c.GuestPing(context.Background(), *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "guest agent ping: %v\n", err)
		return 1
	}
	return 0
}
