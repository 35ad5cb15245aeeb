package testutil

import (
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// SyncRequest is what the node agent sends a launcher for vmi on a node that runs guests under
// emulation, with nics as the host sides of its interfaces (by interface name).
func SyncRequest(t testing.TB, vmi *v1alpha1.VirtualMachineInstance, nics map[string]machine.NIC) *protocol.SyncRequest {
	t.Helper()
	m, err := translate.Machine(vmi, translate.Host{Emulation: true, NICs: nics})
	if err != nil {
		t.Fatalf("describe the machine of %s: %v", vmi.Name, err)
	}
	return &protocol.SyncRequest{Machine: *m}
}
