package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// bootTimeout bounds a guest's way from VM creation to its console banner under emulation.
const bootTimeout = 3 * time.Minute

// namespace makes a namespace for one test and deletes it (and whatever is left in it) at the end.
func namespace(t *testing.T) string { return ec.Namespace(t, "e2e-") }

// run runs a command against the cluster and returns its stdout, failing the test with its stderr.
func run(t *testing.T, stdin []byte, name string, args ...string) string {
	t.Helper()
	return ec.Run(t, stdin, name, args...)
}

// demoVM is config/samples/vm-demo.yaml renamed into ns, with the given run strategy; its guest
// prints "tick N" every second, which shows whether it rebooted.
func demoVM(t *testing.T, ns, name string, strategy v1alpha1.RunStrategy) *v1alpha1.VirtualMachine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "samples", "vm-demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := yaml.UnmarshalStrict(data, vm); err != nil {
		t.Fatalf("vm-demo.yaml: %v", err)
	}
	vm.Namespace, vm.Name = ns, name
	vm.Spec.RunStrategy = &strategy
	vm.Spec.Template.Spec.Domain.Firmware.KernelBoot.KernelArgs = strings.Replace(
		vm.Spec.Template.Spec.Domain.Firmware.KernelBoot.KernelArgs, "qvirt.hostname=demo", "qvirt.hostname="+name, 1) + " qvirt.tick=0"
	return vm
}

// applyVM creates vm with `kubectl apply`, as a user would.
func applyVM(t *testing.T, vm *v1alpha1.VirtualMachine) {
	t.Helper()
	vm.APIVersion, vm.Kind = v1alpha1.GroupVersion.String(), "VirtualMachine"
	data, err := yaml.Marshal(vm)
	if err != nil {
		t.Fatal(err)
	}
	run(t, data, kubectl, "apply", "-f", "-")
}

func getVMI(t *testing.T, ns, name string) (*v1alpha1.VirtualMachineInstance, error) {
	var vmi v1alpha1.VirtualMachineInstance
	err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vmi)
	return &vmi, err
}

// waitVMI waits until the VMI ns/name satisfies ok and returns it.
func waitVMI(t *testing.T, ns, name string, d time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got *v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, d, fmt.Sprintf("VMI %s/%s %s", ns, name, what), func() bool {
		v, err := getVMI(t, ns, name)
		if err != nil {
			got = nil
			return ok(nil)
		}
		got = v
		return ok(v)
	}, func() string {
		if got == nil {
			return "no VMI"
		}
		return fmt.Sprintf("VMI %s phase %s node %s status %+v", got.UID, got.Status.Phase, got.Status.NodeName, got.Status)
	})
	return got
}

// running is a VMI that runs with its pod address known, other than the one with UID not.
func running(not types.UID) func(*v1alpha1.VirtualMachineInstance) bool {
	return func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.UID != not && v.DeletionTimestamp == nil && v.Status.Phase == v1alpha1.Running &&
			len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].IP != ""
	}
}

func gone(v *v1alpha1.VirtualMachineInstance) bool { return v == nil }

// nodeIndex is the number of the virtual node a VMI runs on.
func nodeIndex(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(vmi.Status.NodeName, "qvirt-node-%d", &i); err != nil {
		t.Fatalf("VMI %s runs on %q, not a local node", vmi.Name, vmi.Status.NodeName)
	}
	return i
}

// vmiDir is the VMI's launcher directory on its node.
func vmiDir(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) launcher.Dir {
	t.Helper()
	d, err := cluster.LauncherDir(dir, nodeIndex(t, vmi), vmi)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// console attaches to the VMI's serial console.
func console(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *testutil.Console {
	t.Helper()
	return testutil.AttachConsole(t, vmiDir(t, vmi).Serial())
}

// qemuPID is the host PID of the VMI's QEMU: the child of its active launcher pod's process (the
// pod's container ID is process://<host pid>). The launcher and its pid file see QEMU's PID in the
// pod's own PID namespace, which means nothing on the host.
func qemuPID(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) int {
	t.Helper()
	for _, p := range ec.LauncherPods(t, vmi) {
		if _, active := vmi.Status.ActivePods[p.UID]; !active || len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		launcher, err := strconv.Atoi(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "process://"))
		if err != nil {
			t.Fatalf("launcher pod %s: container ID %q", p.Name, p.Status.ContainerStatuses[0].ContainerID)
		}
		// A child belongs to the thread that forked it: read every thread's.
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", launcher))
		var children []string
		for _, f := range files {
			b, _ := os.ReadFile(f)
			children = append(children, strings.Fields(string(b))...)
		}
		for _, c := range children {
			if exe, _ := os.Readlink("/proc/" + c + "/exe"); strings.HasSuffix(exe, "/qemu-system-x86_64") {
				pid, _ := strconv.Atoi(c)
				return pid
			}
		}
	}
	t.Fatalf("QEMU of VMI %s: no QEMU child of its active launcher pod's process", vmi.Name)
	return 0
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// httpGet gets the guest's page at ip, retrying for d; it returns the body.
func httpGet(t *testing.T, ip string, d time.Duration) string {
	t.Helper()
	return testutil.HTTPBody(t, "http://"+ip+"/", d)
}

// request appends state change requests to the VM's status, as `qvirtctl start/stop/restart` do.
func request(t *testing.T, ns, name string, reqs ...v1alpha1.VirtualMachineStateChangeRequest) {
	t.Helper()
	ctx := context.Background()
	testutil.Eventually(t, 30*time.Second, "state change request on VM "+name, func() bool {
		var vm v1alpha1.VirtualMachine
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
			return false
		}
		vm.Status.StateChangeRequests = append(vm.Status.StateChangeRequests, reqs...)
		err := cl.Status().Update(ctx, &vm)
		if err != nil && !apierrors.IsConflict(err) {
			t.Logf("request: %v", err)
		}
		return err == nil
	})
}

func stopReq(uid types.UID) v1alpha1.VirtualMachineStateChangeRequest {
	return v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &uid}
}

var startReq = v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}

// startDemo applies a demo VM (and starts it, if Manual) and waits for its guest's banner; it returns the running VMI and its
// console.
func startDemo(t *testing.T, ns, name string, strategy v1alpha1.RunStrategy) (*v1alpha1.VirtualMachineInstance, *testutil.Console) {
	t.Helper()
	vm := demoVM(t, ns, name, strategy)
	if strategy != v1alpha1.RunStrategyManual {
		return bootVM(t, vm)
	}
	applyVM(t, vm)
	request(t, ns, name, startReq) // a Manual VM starts only when asked
	return waitBooted(t, ns, name)
}

// bootVM applies vm and waits for its guest's ready line.
func bootVM(t *testing.T, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachineInstance, *testutil.Console) {
	t.Helper()
	applyVM(t, vm)
	return waitBooted(t, vm.Namespace, vm.Name)
}

// waitBooted waits for instance name to run and its guest to print its ready line.
func waitBooted(t *testing.T, ns, name string) (*v1alpha1.VirtualMachineInstance, *testutil.Console) {
	t.Helper()
	vmi := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	con := console(t, vmi)
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	return vmi, con
}

// stays checks for d that the VMI keeps satisfying ok.
func stays(t *testing.T, ns, name string, d time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		v, err := getVMI(t, ns, name)
		if err != nil {
			v = nil
		}
		if !ok(v) {
			t.Fatalf("VMI %s/%s: no longer %s: %+v", ns, name, what, v)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
