package cli

import (
	"context"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// action PUTs body to a subresource of the named object in the current namespace.
func (e *env) action(ctx context.Context, resource, name, sub string, body any) ([]byte, error) {
	c, err := e.connect()
	if err != nil {
		return nil, err
	}
	b, err := c.Do(ctx, http.MethodPut, subv1.Path(c.Namespace, resource, name, sub), body)
	if apierrors.IsNotFound(err) && !serviceMissing(err) {
		short := map[string]string{subv1.VirtualMachines: "vm", subv1.VirtualMachineInstances: "vmi"}[resource]
		return nil, withHint(err, "Check the name and the namespace (-n); list them with: kubectl get %s -n %s", short, c.Namespace)
	}
	return b, err
}

func newStart(e *env) *cobra.Command {
	var opts subv1.StartOptions
	cmd := &cobra.Command{
		Use:   "start VM",
		Short: "Start a virtual machine",
		Long: "Start the VirtualMachine VM: PUT .../virtualmachines/VM/start. With --paused the guest is\n" +
			"created with its vCPUs stopped (unpause it later). Prints \"VM VM was scheduled to start\".",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.action(cmd.Context(), subv1.VirtualMachines, args[0], subv1.Start, &opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VM %s was scheduled to start\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&opts.Paused, "paused", false, "start with the vCPUs paused")
	return cmd
}

func newStop(e *env) *cobra.Command {
	var grace int64
	var force bool
	cmd := &cobra.Command{
		Use:   "stop VM",
		Short: "Stop a virtual machine",
		Long: "Stop the VirtualMachine VM: PUT .../virtualmachines/VM/stop. The guest gets an ACPI\n" +
			"power-down and --grace-period seconds (default: the VMI's terminationGracePeriodSeconds)\n" +
			"before QEMU quits. --force stops at once (grace period 0) and also stops a VM whose\n" +
			"instance is still starting. Prints \"VM VM was scheduled to stop\".",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := subv1.StopOptions{Force: force}
			if cmd.Flags().Changed("grace-period") {
				if err := checkGrace(grace, force); err != nil {
					return err
				}
				opts.GracePeriodSeconds = &grace
			}
			if _, err := e.action(cmd.Context(), subv1.VirtualMachines, args[0], subv1.Stop, &opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VM %s was scheduled to stop\n", args[0])
			return nil
		},
	}
	cmd.Flags().Int64Var(&grace, "grace-period", 0, "seconds the guest gets to power off (default: the VMI's terminationGracePeriodSeconds)")
	cmd.Flags().BoolVar(&force, "force", false, "stop at once, also while the instance is starting")
	return cmd
}

// checkGrace refuses a negative --grace-period, and one above 0 with --force, as kubectl delete
// does.
func checkGrace(grace int64, force bool) error {
	switch {
	case grace < 0:
		return fmt.Errorf("--grace-period %d: must be 0 or more seconds", grace)
	case force && grace > 0:
		return fmt.Errorf("--force and --grace-period %d cannot be used together: --force stops at once (leave --grace-period out or use 0)", grace)
	}
	return nil
}

func newRestart(e *env) *cobra.Command {
	var grace int64
	var force bool
	cmd := &cobra.Command{
		Use:   "restart VM",
		Short: "Restart a virtual machine",
		Long: "Restart the VirtualMachine VM: PUT .../virtualmachines/VM/restart; its instance is stopped\n" +
			"(with --grace-period seconds, default the VMI's; --force stops it at once) and a new one started.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := subv1.RestartOptions{Force: force}
			if cmd.Flags().Changed("grace-period") {
				if err := checkGrace(grace, force); err != nil {
					return err
				}
				opts.GracePeriodSeconds = &grace
			}
			if _, err := e.action(cmd.Context(), subv1.VirtualMachines, args[0], subv1.Restart, &opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VM %s was scheduled to restart\n", args[0])
			return nil
		},
	}
	cmd.Flags().Int64Var(&grace, "grace-period", 0, "seconds the guest gets to power off before the restart")
	cmd.Flags().BoolVar(&force, "force", false, "stop the current instance at once (grace period 0)")
	return cmd
}

// newPause is pause (pause=true) or unpause.
func newPause(e *env, pause bool) *cobra.Command {
	verb, sub, done, short := "pause", subv1.Pause, "paused", "Stop a running guest's vCPUs, keeping its memory"
	if !pause {
		verb, sub, done, short = "unpause", subv1.Unpause, "unpaused", "Resume a paused guest's vCPUs"
	}
	return &cobra.Command{
		Use:       verb + " vm|vmi NAME",
		Short:     short,
		ValidArgs: []string{"vm", "vmi"},
		Long: fmt.Sprintf("%s the instance NAME: PUT .../virtualmachineinstances/NAME/%s. With `vm` NAME is a\n"+
			"VirtualMachine (it must exist) and its instance of the same name is %s.", capitalise(verb), sub, done),
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name := args[0], args[1]
			if err := e.checkKind(cmd.Context(), kind, name); err != nil {
				return err
			}
			if _, err := e.action(cmd.Context(), subv1.VirtualMachineInstances, name, sub, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VMI %s was %s\n", name, done)
			return nil
		},
	}
}

// checkKind validates the vm|vmi argument; for vm the VirtualMachine must exist, so that a typo
// names the VM rather than its instance.
func (e *env) checkKind(ctx context.Context, kind, name string) error {
	switch kind {
	case "vmi":
		return nil
	case "vm":
	default:
		return fmt.Errorf("first argument %q: want vm or vmi", kind)
	}
	c, err := e.connect()
	if err != nil {
		return err
	}
	var vm qv1.VirtualMachine
	err = c.Objects.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: name}, &vm)
	if apierrors.IsNotFound(err) {
		return withHint(err, "List the virtual machines of namespace %s with: kubectl get vm -n %s", c.Namespace, c.Namespace)
	}
	return err
}

func newSoftReboot(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "softreboot VMI",
		Short: "Ask the guest to reboot (ACPI), without restarting QEMU",
		Long: "Soft-reboot the instance VMI: PUT .../virtualmachineinstances/VMI/softreboot. The guest\n" +
			"reboots; the VMI and its pod stay.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.action(cmd.Context(), subv1.VirtualMachineInstances, args[0], subv1.SoftReboot, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VMI %s was scheduled to soft-reboot\n", args[0])
			return nil
		},
	}
}

func capitalise(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
