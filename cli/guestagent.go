package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// The guest agent's queries, as KubeVirt's virtctl has them: each GETs its subresource and prints
// the JSON answer indented. They need a guest agent running in the guest; without one qvirt-api
// answers 409.

func newGuestOSInfo(e *env) *cobra.Command {
	return guestQuery(e, subv1.GuestOSInfo, "Print what the guest agent reports about the guest",
		"the agent's version and commands, the guest's hostname, operating system, logged-in users and\n"+
			"filesystems, and whether they are frozen")
}

func newUserList(e *env) *cobra.Command {
	return guestQuery(e, subv1.UserList, "Print the users logged in to the guest", "the users the guest agent reports")
}

func newFileSystemList(e *env) *cobra.Command {
	return guestQuery(e, subv1.FileSystemList, "Print the guest's mounted filesystems", "the filesystems the guest agent reports")
}

func guestQuery(e *env, sub, short, what string) *cobra.Command {
	return &cobra.Command{
		Use:   sub + " VMI",
		Short: short,
		Long: fmt.Sprintf("GET .../virtualmachineinstances/VMI/%s and print %s as JSON.\n"+
			"Needs qemu-guest-agent running in the guest.", sub, what),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.connect()
			if err != nil {
				return err
			}
			b, err := c.Do(cmd.Context(), http.MethodGet, subv1.Path(c.Namespace, subv1.VirtualMachineInstances, args[0], sub), nil)
			if err != nil {
				return err
			}
			var out bytes.Buffer
			if err := json.Indent(&out, b, "", "  "); err != nil {
				return fmt.Errorf("%s of VMI %s: the answer is not JSON: %w", sub, args[0], err)
			}
			out.WriteByte('\n')
			_, err = cmd.OutOrStdout().Write(out.Bytes())
			return err
		},
	}
}
