package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/qvirt/qvirt/machine"
)

// The TPM kind: a TPM 2.0 on QEMU's TIS interface (tpm-tis, an ISA device, as KubeVirt's amd64
// guests get), emulated by swtpm, which the launcher runs beside QEMU (daemons.go). QEMU drives
// it over its control socket (the emulator backend: QEMU also hands it the data channel) and
// swtpm ends when QEMU closes that socket (--terminate). The TPM's state is in the run directory,
// made afresh at each start: it lasts as long as the QEMU (a guest reboot keeps it, a restart of
// the VM does not), KubeVirt's non-persistent vTPM; a persistent TPM's is in the VM's state
// directory (machine.State), kept from one instance to the next. Fixed when QEMU starts: cold
// form only.

// DefaultSWTPM is the TPM emulator as Debian installs it (package swtpm).
const DefaultSWTPM = "/usr/bin/swtpm"

// TPM ids: the device, its backend and the backend's socket chardev.
const (
	TPMDeviceID  = "tpm"
	tpmBackendID = "tpm0"
	tpmChardevID = "chr-tpm"
)

// TPM is the control socket of the machine's swtpm.
func (d Dir) TPM() string { return filepath.Join(string(d), "swtpm.sock") }

// TPMState is the directory of the TPM's state.
func (d Dir) TPMState() string { return filepath.Join(string(d), "tpm") }

// tpm adds the TPM device and its backend, when the machine has one.
func (b *builder) tpm() {
	if !b.m.TPM {
		return
	}
	b.devs = append(b.devs,
		"-chardev", "socket,id="+tpmChardevID+",path="+optEscape(Dir(b.m.RunDir).TPM()),
		"-tpmdev", "emulator,id="+tpmBackendID+",chardev="+tpmChardevID,
		"-device", "tpm-tis,id="+TPMDeviceID+",tpmdev="+tpmBackendID)
}

// startTPM starts the swtpm of m's TPM on its state directory (tpmState: fresh, or the persistent
// one as it was left), listening on its control socket before it returns.
func (d *daemons) startTPM(m *Machine, swtpm string) error {
	if swtpm == "" {
		swtpm = DefaultSWTPM
	}
	state, err := tpmState(m)
	if err != nil {
		return err
	}
	sock, err := listenFor(Dir(m.RunDir).TPM())
	if err != nil {
		return err
	}
	defer sock.Close()
	// The state directory is the working directory and named relative to it: swtpm's options
	// are comma-separated with no escaping, and the run directory's path may hold a comma.
	cmd := exec.Command(swtpm, "socket", "--tpm2", "--tpmstate", "dir=.,mode=0600",
		"--ctrl", "type=unixio,fd=3", "--terminate")
	cmd.Dir = state
	cmd.ExtraFiles = []*os.File{sock}
	return d.run(daemon{name: "swtpm", of: "the TPM", cmd: cmd}, d.log.WithValues("tpm", state))
}

// tpmState makes the directory of the TPM's state: in the VM's state directory when the TPM
// persists (machine.State), as it was left; otherwise afresh in the run directory.
func tpmState(m *Machine) (string, error) {
	if st := m.State; st != nil && st.TPM {
		state := filepath.Join(st.Dir, machine.TPMStateDir)
		if err := os.MkdirAll(state, 0o700); err != nil {
			return "", fmt.Errorf("TPM state directory: %w", err)
		}
		return state, nil
	}
	state := Dir(m.RunDir).TPMState()
	if err := os.RemoveAll(state); err != nil {
		return "", fmt.Errorf("remove the last TPM state: %w", err)
	}
	if err := os.Mkdir(state, 0o700); err != nil {
		return "", fmt.Errorf("TPM state directory: %w", err)
	}
	return state, nil
}
