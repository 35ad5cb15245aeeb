package e2e

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// qvirtctl runs the qvirtctl binary against the cluster and returns its output and exit code.
func qvirtctl(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "qvirtctl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+lc.Kubeconfig)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("qvirtctl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), 0
}

// mustQvirtctl runs qvirtctl and fails the test unless it succeeds.
func mustQvirtctl(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := qvirtctl(t, args...)
	if code != 0 {
		t.Fatalf("qvirtctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// qmpStatus is the guest's run state as `qvirtctl qmp NAME -- query-status` prints it.
func qmpStatus(t *testing.T, ns, name string) string {
	t.Helper()
	out := mustQvirtctl(t, "qmp", name, "-n", ns, "--", "query-status")
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("qvirtctl qmp -- query-status printed %q: %v", out, err)
	}
	return st.Status
}

// TestQvirtctl drives a VM through qvirt-api the way a user does with qvirtctl: start it, its
// console through a pseudo-terminal (the boot banner, a command and its answer, Ctrl+] to leave),
// the QMP shell one-shot and HMP, pause and unpause, a VNC screenshot, the versions, a disk hot-plugged
// and removed, a live migration with --wait, stop and start again (paused, then unpaused); and the
// errors a user meets.
func TestQvirtctl(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "cli"
	vm := demoVM(t, ns, name, v1alpha1.RunStrategyManual)
	vm.Spec.Template.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr.To(true)
	applyVM(t, vm)
	mustQvirtctl(t, "start", name, "-n", ns)
	waitVMI(t, ns, name, time.Minute, "created", func(v *v1alpha1.VirtualMachineInstance) bool { return v != nil })

	// The console waits for the starting instance, so it sees the guest boot.
	con := exec.Command(filepath.Join(bin, "qvirtctl"), "console", name, "-n", ns, "--timeout", "3m")
	con.Env = append(os.Environ(), "KUBECONFIG="+lc.Kubeconfig)
	term := testutil.StartOnPTY(t, con)
	expectScreen(t, &term.Screen, "QVIRT-GUEST-READY", bootTimeout)
	term.Type(t, "echo qvirt-$((6*7))\r")
	expectScreen(t, &term.Screen, "qvirt-42", time.Minute)
	if err := term.Detach(10 * time.Second); err != nil {
		t.Errorf("qvirtctl console after Ctrl+]: %v\n%s", err, term.Screen.String())
	}

	if st := qmpStatus(t, ns, name); st != "running" {
		t.Errorf("query-status: %q, want running", st)
	}
	mustQvirtctl(t, "pause", "vmi", name, "-n", ns)
	if st := qmpStatus(t, ns, name); st != "paused" {
		t.Errorf("query-status after pause: %q, want paused", st)
	}
	mustQvirtctl(t, "unpause", "vmi", name, "-n", ns)
	if st := qmpStatus(t, ns, name); st != "running" {
		t.Errorf("query-status after unpause: %q, want running", st)
	}

	shot := filepath.Join(t.TempDir(), "screen.png")
	mustQvirtctl(t, "vnc", "screenshot", name, "-n", ns, "-o", shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("vnc screenshot wrote no valid PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 320 || b.Dy() < 200 {
		t.Errorf("screenshot is %dx%d, want the guest's VGA screen", b.Dx(), b.Dy())
	}

	if out := mustQvirtctl(t, "qmp", name, "-n", ns, "--hmp", "info status"); !strings.Contains(out, "running") {
		t.Errorf("qvirtctl qmp --hmp 'info status' printed %q, want the VM running", out)
	}
	if out := mustQvirtctl(t, "version"); strings.Count(out, "ersion") < 2 {
		t.Errorf("qvirtctl version printed %q, want the client's and the server's", out)
	}

	// A disk hot-plugged through the VM reaches the running guest's status, and goes again.
	mustQvirtctl(t, "addvolume", name, "-n", ns, "--volume-name", "scratch", "--empty-disk", "8Mi")
	waitVMI(t, ns, name, time.Minute, "volume scratch Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		for _, vs := range v.Status.VolumeStatus {
			if vs.Name == "scratch" {
				return vs.Phase == v1alpha1.VolumeReady && vs.Hotplugged
			}
		}
		return false
	})
	mustQvirtctl(t, "removevolume", name, "-n", ns, "--volume-name", "scratch")
	waitVMI(t, ns, name, time.Minute, "volume scratch gone", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && len(v.Status.VolumeStatus) == 0
	})

	before := waitVMI(t, ns, name, 10*time.Second, "Running", running(""))
	out := mustQvirtctl(t, "migrate", name, "-n", ns, "--wait", "--timeout", "3m")
	if !strings.Contains(out, "created") {
		t.Errorf("qvirtctl migrate printed %q, want the migration it created", out)
	}
	waitVMI(t, ns, name, 30*time.Second, "Running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && v.UID == before.UID && v.Status.NodeName != before.Status.NodeName
	})

	mustQvirtctl(t, "stop", name, "-n", ns, "--grace-period", "20")
	waitVMI(t, ns, name, 2*time.Minute, "gone after qvirtctl stop", gone)
	// start --paused: the new instance runs with its vCPUs stopped until unpaused.
	mustQvirtctl(t, "start", name, "-n", ns, "--paused")
	waitVMI(t, ns, name, bootTimeout, "Running and Paused after qvirtctl start --paused", func(v *v1alpha1.VirtualMachineInstance) bool {
		if !running(before.UID)(v) {
			return false
		}
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstancePaused)
		return c != nil && c.Reason == "PausedStartStrategy"
	})
	if st := qmpStatus(t, ns, name); st != "prelaunch" {
		t.Errorf("query-status after start --paused: %q, want prelaunch (never run)", st)
	}
	mustQvirtctl(t, "unpause", "vmi", name, "-n", ns)
	waitVMI(t, ns, name, time.Minute, "Ready after unpause", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running(before.UID)(v) && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	})
	if st := qmpStatus(t, ns, name); st != "running" {
		t.Errorf("query-status after unpause: %q, want running", st)
	}
}

// TestQvirtctlErrors: what a user gets wrong gets a clear error and a non-zero exit, and the VM runs
// on undisturbed.
func TestQvirtctlErrors(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "oops"
	vmi, _ := startDemo(t, ns, name, v1alpha1.RunStrategyAlways)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"console", "nosuch", "-n", ns, "--timeout", "5s"}, "nosuch"},
		{[]string{"qmp", "nosuch", "-n", ns, "--", "query-status"}, "nosuch"},
		{[]string{"qmp", name, "-n", ns, "--", "query-status", "{not json"}, "JSON"},
		{[]string{"qmp", name, "-n", ns, "--", "no-such-command"}, "CommandNotFound"},
		{[]string{"stop", "nosuch", "-n", ns}, "nosuch"},
	} {
		out, errOut, code := qvirtctl(t, tc.args...)
		if code == 0 || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("qvirtctl %s: exit %d, output %q; want a failure mentioning %q", strings.Join(tc.args, " "), code, out+errOut, tc.want)
		}
	}
	if v, err := getVMI(t, ns, name); err != nil || v.UID != vmi.UID || v.Status.Phase != v1alpha1.Running {
		t.Errorf("the VM was disturbed by the failed commands: %+v %v", v, err)
	}
	if st := qmpStatus(t, ns, name); st != "running" {
		t.Errorf("query-status after the failed commands: %q", st)
	}
}

// expectScreen waits until the pseudo-terminal showed want.
func expectScreen(t *testing.T, screen *testutil.SyncBuffer, want string, d time.Duration) {
	t.Helper()
	testutil.Eventually(t, d, "the console showing "+want, func() bool {
		return strings.Contains(screen.String(), want)
	}, func() string { return testutil.Tail(screen.String(), 2000) })
}
