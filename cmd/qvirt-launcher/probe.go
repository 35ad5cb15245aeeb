package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// probe is `qvirt-launcher probe`, the exec probe the launcher pod's compute container carries
// for a guestAgentPing probe (--guest-agent-ping) or an exec probe (--guest-exec -- CMD ARGS...),
// as KubeVirt's virt-probe: it asks this pod's own launcher, over its command socket, to ping the
// guest agent or to run the command in the guest through it. Exit 0 when the agent answered or
// the command exited 0, 1 (with the reason and the command's output, which the kubelet puts in
// its Unhealthy Event) otherwise, 2 for bad flags. It runs in the tenant's own pod, as the pod's
// user, and reaches nothing the pod's user cannot.
func probe(args []string) int {
	return runProbe(args, os.Stdout, os.Stderr)
}

func runProbe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socketDir := fs.String(podlayout.FlagSocketDir, podlayout.SocketDir, "the pod's socket directory")
	uid := fs.String(podlayout.FlagVMIUID, "", "UID of the VirtualMachineInstance this pod runs (required)")
	ping := fs.Bool(podlayout.FlagGuestAgentPing, false, "ping the guest agent")
	exec := fs.Bool(podlayout.FlagGuestExec, false, "run the command after -- in the guest through the guest agent")
	timeout := fs.Duration(podlayout.FlagProbeTimeout, time.Second, "how long the guest agent or the command may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	command := fs.Args()
	switch {
	case *uid == "" || *timeout <= 0 || *ping == *exec:
		fmt.Fprintln(stderr, "qvirt-launcher probe: --vmi-uid, a positive --timeout and one of --guest-agent-ping or --guest-exec are required")
		return 2
	case *exec && len(command) == 0:
		fmt.Fprintln(stderr, "qvirt-launcher probe: --guest-exec needs the command after --")
		return 2
	case *ping && len(command) > 0:
		fmt.Fprintf(stderr, "qvirt-launcher probe: --guest-agent-ping takes no command, got %q\n", command)
		return 2
	}
	c := launcher.NewClient(launcher.VMIDir(*socketDir, *uid).Command())
	if *ping {
		if err := c.GuestPing(context.Background(), *timeout); err != nil {
			fmt.Fprintf(stderr, "guest agent ping: %v\n", err)
			return 1
		}
		return 0
	}
	secs := int32(max((*timeout+time.Second-1)/time.Second, 1))
	res, err := c.GuestExecProbe(context.Background(), protocol.GuestExecProbe{Command: command, TimeoutSeconds: secs})
	var apiErr *launcher.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == 409:
		fmt.Fprintf(stderr, "guest command %q: not run: %v (the probe needs qemu-guest-agent running in the guest)\n", command, err)
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "guest command %q: %v\n", command, err)
		return 1
	}
	fmt.Fprint(stdout, res.Output)
	switch {
	case res.Skipped != "":
		fmt.Fprintf(stdout, "guest command not run: %s\n", res.Skipped)
		return 0
	case res.Signal != 0:
		fmt.Fprintf(stderr, "guest command %q ended by signal %d\n", command, res.Signal)
		return 1
	case res.ExitCode != 0:
		fmt.Fprintf(stderr, "guest command %q exited with code %d\n", command, res.ExitCode)
		return 1
	}
	return 0
}
