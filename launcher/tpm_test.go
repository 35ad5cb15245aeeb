package launcher_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestTPM boots the test guest with KubeVirt's `tpm: {}`: the guest finds a TPM 2.0 and
// gets random bytes from it (TPM2_GetRandom through /dev/tpm0), served by the swtpm the launcher
// runs, which ends with QEMU.
func TestGuestTPM(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
	v := newLauncher(t)
	ctx := context.Background()
	if st, err := v.client.Sync(ctx, testutil.SyncRequest(t, vmi, nil)); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	swtpm := daemonPID(t, "swtpm", v.runDir)
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	from := len(c.Text())
	c.Send(t, `echo "TPMV-[$(cat /sys/class/tpm/tpm0/tpm_version_major)]"`)
	c.Expect(t, from, "TPMV-[2]", time.Minute)
	// TPM2_GetRandom of 8 bytes; the answer is a success header and 8 bytes.
	from = len(c.Text())
	c.Send(t, `exec 3<>/dev/tpm0; printf '\200\001\000\000\000\014\000\000\001\173\000\010' >&3; dd bs=20 count=1 <&3 2>/dev/null | od -An -tx1 | head -1; exec 3<&-`)
	c.Expect(t, from, "80 01 00 00 00 14 00 00 00 00 00 08", time.Minute)

	if err := v.client.Kill(ctx); err != nil {
		t.Fatalf("kill: %v", err)
	}
	waitFor(t, 30*time.Second, "swtpm to end with QEMU", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(swtpm))
		return os.IsNotExist(err)
	})
}

// daemonPID is the pid of this test process's child named comm (a launcher's daemon) that works in
// a directory under dir, the launcher's run directory: tests run in parallel, each launcher with
// its own daemons, all children of this process.
func daemonPID(t *testing.T, comm, dir string) int {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		end := strings.LastIndexByte(s, ')')
		if end < 0 || s[strings.IndexByte(s, '(')+1:end] != comm {
			continue
		}
		cwd, err := os.Readlink(d + "/cwd")
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		if f := strings.Fields(s[end+1:]); len(f) > 1 && f[1] == self {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatalf("no %s child of this test working under %s", comm, dir)
	return 0
}

// tpmShell defines, in the guest's shell, pcrs (the boot measurements SeaBIOS made, PCRs 0-7, on
// one line) and rnd (TPM2_GetRandom through /dev/tpm0, its answer's header in hex).
const tpmShell = `pcrs() { for i in 0 1 2 3 4 5 6 7; do cut -c1-16 /sys/class/tpm/tpm0/pcr-sha256/$i; done | tr '\n' ' '; }; ` +
	`rnd() { exec 3<>/dev/tpm0; printf '\200\001\000\000\000\014\000\000\001\173\000\010' >&3; dd bs=20 count=1 <&3 2>/dev/null | od -An -tx1 | head -1 | cut -c1-36; exec 3<&-; }`

// TestTPMMigrates live-migrates a guest with a TPM: the target's swtpm gets the TPM's state
// through the migration stream (QEMU's emulator backend), so the guest's boot measurements read
// the same there and the TPM answers as one that has started (a fresh swtpm would answer
// TPM_RC_INITIALIZE); the source's swtpm ends with its QEMU.
func TestTPMMigrates(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks, vmi.Spec.Volumes = nil, nil
	vmi.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{}
	src := newLauncher(t)
	ctx := context.Background()
	if _, err := src.client.Sync(ctx, testutil.SyncRequest(t, vmi, nil)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	srcTPM := daemonPID(t, "swtpm", src.runDir)
	c := attach(t, src.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, tpmShell)
	ask := func(c *console, cmd string) string {
		t.Helper()
		from := len(c.Text())
		c.Send(t, `echo "<$(`+cmd+`)>"`)
		re := regexp.MustCompile(`<([0-9a-fA-F ]{20,})>`)
		var got string
		deadline := time.Now().Add(time.Minute)
		for {
			if m := re.FindStringSubmatch(c.Text()[from:]); m != nil {
				got = strings.TrimSpace(m[1])
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("no answer to %s; the console ends with %q", cmd, testutil.Tail(c.Text(), 600))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	pcrs := ask(c, "pcrs")
	if strings.Trim(pcrs, "0 ") == "" {
		t.Fatalf("the boot measurements are all zero (%q): nothing to tell a migrated TPM from a new one", pcrs)
	}
	const started = "80 01 00 00 00 14 00 00 00 00 00 08"
	if got := ask(c, "rnd"); got != started {
		t.Fatalf("TPM2_GetRandom answers %q on the source, want %q", got, started)
	}

	dst := localDiskTarget(t, src, vmi)
	dc := attach(t, dst.runDir)
	liveMigrate(t, src, dst)
	dc.Send(t, tpmShell)
	if got := ask(dc, "pcrs"); got != pcrs {
		t.Errorf("the boot measurements read %q on the target, %q on the source", got, pcrs)
	}
	if got := ask(dc, "rnd"); got != started {
		t.Errorf("TPM2_GetRandom answers %q on the target, want %q (the TPM's state did not come along)", got, started)
	}
	waitFor(t, 30*time.Second, "the source's swtpm to end with its QEMU", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(srcTPM))
		return os.IsNotExist(err)
	})
}
