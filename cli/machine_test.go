package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/machine"
)

// `qvirtctl machine` prints the machine description the node agent would send for a manifest, for
// `qvirt-launcher run`; a manifest it cannot describe is refused naming the field.
func TestMachineCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"qvirtctl", "machine", "--emulation", "-f", "../test/guest/vmi.yaml"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var m machine.Machine
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("output is not a machine description: %v\n%s", err, out.String())
	}
	if m.Name != "testguest" || m.Accel != machine.AccelTCG || m.Kernel == nil || m.MemoryMiB <= 0 || m.UID == "" {
		t.Errorf("machine %+v: want the test guest's, under TCG, with its kernel and a UID", m)
	}

	errOut.Reset()
	if code := Main([]string{"qvirtctl", "machine"}, nil, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "flag -f") {
		t.Errorf("without -f: exit %d, stderr %q; want a refusal naming flag -f", code, errOut.String())
	}
}
