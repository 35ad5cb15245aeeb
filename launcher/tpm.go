package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/internal/atomicfile"
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
	state, err := tpmState(m, d.log)
	if err != nil {
		return err
	}
	if m.State != nil && m.State.TPM && m.Incoming {
		d.tpmIncoming = state
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
	_, err = d.run(daemon{name: "swtpm", of: "the TPM", cmd: cmd}, d.log.WithValues("tpm", state))
	return err
}

// tpmState makes the directory of the TPM's state: the persistent one when the TPM persists
// (persistentTPMState); otherwise afresh in the run directory.
func tpmState(m *Machine, log logr.Logger) (string, error) {
	if st := m.State; st != nil && st.TPM {
		return persistentTPMState(st.Dir, m.Incoming, log)
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

// A persistent TPM's state is a directory in the VM's state directory: the one the file
// tpmCurrentFile names, machine.TPMStateDir when there is none. A migration target cannot use it:
// swtpm 0.7 locks it while the source's swtpm runs. So the target's swtpm starts on a new
// directory (tpm-<random>), which QEMU fills from the migration stream, and which becomes the
// VM's TPM state when the target takes the guest over (adoptTPMState): tpmCurrentFile is
// rewritten, a rename, atomic on any filesystem the claim may be on, at the moment the handover
// is decided. The directories no longer named go then, or when the VM next starts afresh.
const tpmCurrentFile = "tpm-current"

// persistentTPMState is the TPM state directory in dir: the current one, made when absent, or a
// new one for a migration target.
func persistentTPMState(dir string, incoming bool, log logr.Logger) (string, error) {
	if incoming {
		state, err := os.MkdirTemp(dir, machine.TPMStateDir+"-")
		if err != nil {
			return "", fmt.Errorf("TPM state directory for the incoming migration: %w", err)
		}
		return state, nil
	}
	cur, err := currentTPMState(dir)
	if err != nil {
		return "", err
	}
	// No other instance of the VM runs when it starts afresh: what a failed migration left goes.
	// Left over, it takes room on the claim but changes nothing: no failure to start for it.
	if err := removeTPMStates(dir, cur); err != nil {
		log.Error(err, "remove the TPM states earlier migrations left")
	}
	state := filepath.Join(dir, cur)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", fmt.Errorf("TPM state directory: %w", err)
	}
	return state, nil
}

// currentTPMState is the name of the current TPM state directory in dir.
func currentTPMState(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, tpmCurrentFile))
	if errors.Is(err, os.ErrNotExist) {
		return machine.TPMStateDir, nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", tpmCurrentFile, err)
	}
	name := string(b)
	if !isTPMState(name) {
		return "", fmt.Errorf("%s names %q, not a TPM state directory (%s or %s-<letters and digits>)", tpmCurrentFile, name, machine.TPMStateDir, machine.TPMStateDir)
	}
	return name, nil
}

// isTPMState says whether name is one of the TPM state directories' names.
func isTPMState(name string) bool {
	rest, ok := strings.CutPrefix(name, machine.TPMStateDir)
	if !ok || rest == "" {
		return ok
	}
	rest, ok = strings.CutPrefix(rest, "-")
	return ok && rest != "" && strings.IndexFunc(rest, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	}) < 0 && rest != "current"
}

// removeTPMStates removes the TPM state directories in dir other than keep.
func removeTPMStates(dir, keep string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list the TPM states: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != keep && isTPMState(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove the TPM state %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// adoptTPMState makes a migration target's TPM state the VM's, when this machine's TPM persists
// and came with an incoming migration; it returns the name of the state it replaced ("" when it
// did nothing), for restoreTPMState.
func (d *daemons) adoptTPMState() (previous string, err error) {
	if d == nil || d.tpmIncoming == "" {
		return "", nil
	}
	dir := filepath.Dir(d.tpmIncoming)
	if previous, err = currentTPMState(dir); err != nil {
		return "", err
	}
	if err := setTPMState(dir, filepath.Base(d.tpmIncoming)); err != nil {
		return "", err
	}
	return previous, nil
}

// restoreTPMState names previous the VM's TPM state again: the target did not run the guest, and
// the source may take it back.
func (d *daemons) restoreTPMState(previous string) error {
	if previous == "" {
		return nil
	}
	return setTPMState(filepath.Dir(d.tpmIncoming), previous)
}

// dropOldTPMStates removes the TPM states the target's replaced, once the guest runs here. A
// failure is only logged: the guest runs, and the next fresh start removes them (on NFS, say, the
// source's swtpm may still hold its files open, which keeps its directory from going).
func (d *daemons) dropOldTPMStates() {
	if d == nil || d.tpmIncoming == "" {
		return
	}
	if err := removeTPMStates(filepath.Dir(d.tpmIncoming), filepath.Base(d.tpmIncoming)); err != nil {
		d.log.Error(err, "remove the TPM state the migration replaced")
	}
}

// dropUnadoptedTPMState removes a migration target's TPM state when the target ends without having
// taken the guest over.
func (d *daemons) dropUnadoptedTPMState() {
	if d.tpmIncoming == "" {
		return
	}
	if cur, err := currentTPMState(filepath.Dir(d.tpmIncoming)); err == nil && cur != filepath.Base(d.tpmIncoming) {
		if err := os.RemoveAll(d.tpmIncoming); err != nil {
			d.log.Error(err, "remove the TPM state of a migration that did not end here")
		}
	}
}

func setTPMState(dir, name string) error {
	err := atomicfile.WriteDurably(filepath.Join(dir, tpmCurrentFile), 0o600, func(f *os.File) error { _, err := f.WriteString(name); return err })
	if err != nil {
		return fmt.Errorf("name %s the TPM's state: %w", name, err)
	}
	return nil
}
