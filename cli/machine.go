package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/qvirt/qvirt/handler/translate"
)

// newMachine is `qvirtctl machine`: the machine description the node agent would send a launcher
// for a VMI manifest, for `qvirt-launcher run` outside a cluster. The launcher reads only machine
// descriptions, so this is where run mode's VMI → machine translation happens.
func newMachine() *cobra.Command {
	var file string
	var emulation bool
	cmd := &cobra.Command{
		Use:   "machine -f VMI.yaml [--emulation]",
		Short: "Print the machine description of a VMI manifest, for qvirt-launcher run",
		Long: "Translate a VirtualMachineInstance (or VirtualMachine) manifest into the machine description a\n" +
			"launcher runs, exactly as the node agent does, and print it as JSON:\n\n" +
			"  qvirtctl machine --emulation -f test/guest/vmi.yaml > vm.json && qvirt-launcher run -f vm.json\n\n" +
			"Interfaces need the node agent's pod networking and are refused here; an instance without\n" +
			"interfaces gets one on the pod network unless it sets autoattachPodInterface: false.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("flag -f: a VirtualMachineInstance or VirtualMachine manifest is required")
			}
			vmi, err := translate.LoadFile(file)
			if err != nil {
				return err
			}
			m, err := translate.Machine(vmi, translate.Host{Emulation: emulation})
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			for _, n := range m.Notes {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", file, n)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(m)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "VirtualMachineInstance or VirtualMachine manifest")
	cmd.Flags().BoolVar(&emulation, "emulation", false, "describe the machine for software emulation (TCG) instead of KVM")
	return cmd
}
