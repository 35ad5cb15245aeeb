package launcher_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestPersistentStateAcrossInstances: a VM whose TPM and EFI variables persist (KubeVirt's
// tpm.persistent and efi.persistent) keeps them in its state directory (the backend-storage
// claim, in a pod): an EFI variable the guest wrote is there in the next instance, and the next
// instance's TPM is the same TPM powered on again (its resetCount went up), not a new one.
func TestPersistentStateAcrossInstances(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vmi := efiVMI(t, false)
	vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
	start := func() (*vm, *console) {
		t.Helper()
		req := testutil.SyncRequest(t, vmi, nil)
		req.Machine.State = &machine.State{Dir: dir, EFIVars: true, TPM: true}
		v := newLauncher(t)
		if st, err := v.client.Sync(context.Background(), req); err != nil || st.Phase != protocol.PhaseRunning {
			t.Fatalf("sync: %v (phase %s)", err, st.Phase)
		}
		c := attach(t, v.runDir)
		c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
		c.Run(t, efivarsCmd, "EFIVARS-MOUNTED", time.Minute)
		return v, c
	}

	first, c := start()
	c.Run(t, `printf '\007\000\000\000`+testVarData+`' > `+testVar+`; `+readTestVarCmd, "VAR-"+testVarData, time.Minute)
	before := testutil.TPMResetCount(t, c)
	if _, err := first.client.Shutdown(context.Background(), nil); err != nil {
		t.Fatalf("shut the first instance down: %v", err)
	}
	for _, f := range []string{machine.EFIVarsFile, machine.TPMStateDir} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the state directory has no %s after the first instance: %v", f, err)
		}
	}

	_, c = start()
	c.Run(t, readTestVarCmd, "VAR-"+testVarData, time.Minute)
	if after := testutil.TPMResetCount(t, c); after <= before {
		t.Errorf("the TPM's resetCount is %s after a new start, %s before: want it higher (the same TPM powered on again)", after, before)
	} else {
		t.Logf("TPM resetCount %s, then %s", before, after)
	}
}
