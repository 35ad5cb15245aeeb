package apiserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
)

// VM actions are carried out by qvirt-api itself (no VM controller runs here): the tests assert
// the state change requests, migrations and template edits it writes, and its refusals.
func TestVMActions(t *testing.T) {
	e := setup(t)
	view, edit := e.users["view"], e.users["edit"]
	vms := func(name string) string { return name }

	t.Run("start, stop and restart of a running Always VM", func(t *testing.T) {
		vm := createVM(t, "always", v1alpha1.RunStrategyAlways)
		vmi := testVMI(t, vm.Name, "", v1alpha1.Running)
		expectCode(t, edit, vms(vm.Name), sub.Start, "", http.StatusConflict, "is running already")
		expectCode(t, view, vms(vm.Name), sub.Stop, "", http.StatusForbidden, `"virtualmachines/stop"`)
		expectCode(t, edit, vms(vm.Name), sub.Stop, `{"gracePeriodSeconds": 7}`, http.StatusOK, "stop of VMI")
		expectCode(t, edit, vms(vm.Name), sub.Restart, "", http.StatusOK, "restart of VMI")
		// A start after a stop is allowed: the stop is still pending.
		got := requests(t, vm.Name)
		want := []v1alpha1.VirtualMachineStateChangeRequest{
			{Action: v1alpha1.StopRequest, UID: ptr.To(vmi.UID), Data: map[string]string{v1alpha1.StopGracePeriodDataKey: "7"}},
			{Action: v1alpha1.StopRequest, UID: ptr.To(vmi.UID)},
			{Action: v1alpha1.StartRequest},
		}
		if !equalRequests(got, want) {
			t.Errorf("stateChangeRequests:\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("force stop of a starting VMI, force restart", func(t *testing.T) {
		vm := createVM(t, "starting", v1alpha1.RunStrategyAlways)
		vmi := testVMI(t, vm.Name, "", v1alpha1.Scheduling)
		expectCode(t, edit, vm.Name, sub.Stop, "", http.StatusConflict, "still starting (phase Scheduling)")
		expectCode(t, edit, vm.Name, sub.Stop, `{"force": true}`, http.StatusOK, "stop")
		want := []v1alpha1.VirtualMachineStateChangeRequest{{Action: v1alpha1.StopRequest, UID: ptr.To(vmi.UID), Data: map[string]string{v1alpha1.StopGracePeriodDataKey: "0"}}}
		if got := requests(t, vm.Name); !equalRequests(got, want) {
			t.Errorf("stateChangeRequests: got %+v, want %+v", got, want)
		}
		restarted := createVM(t, "restarted", v1alpha1.RunStrategyAlways)
		rvmi := testVMI(t, restarted.Name, "", v1alpha1.Running)
		expectCode(t, edit, restarted.Name, sub.Restart, `{"force": true, "gracePeriodSeconds": 0}`, http.StatusOK, "restart of VMI")
		want = []v1alpha1.VirtualMachineStateChangeRequest{
			{Action: v1alpha1.StopRequest, UID: ptr.To(rvmi.UID), Data: map[string]string{v1alpha1.StopGracePeriodDataKey: "0"}},
			{Action: v1alpha1.StartRequest},
		}
		if got := requests(t, restarted.Name); !equalRequests(got, want) {
			t.Errorf("stateChangeRequests after restart --force: got %+v, want %+v", got, want)
		}
	})

	t.Run("stopped VMs", func(t *testing.T) {
		halted := createVM(t, "halted", v1alpha1.RunStrategyHalted)
		expectCode(t, edit, halted.Name, sub.Stop, "", http.StatusConflict, "is not running")
		expectCode(t, edit, halted.Name, sub.Start, "", http.StatusConflict, "runStrategy Halted")
		expectCode(t, edit, halted.Name, sub.Restart, "", http.StatusConflict, "runStrategy Halted")
		manual := createVM(t, "manual", v1alpha1.RunStrategyManual)
		expectCode(t, edit, manual.Name, sub.Restart, "", http.StatusConflict, "use start")
		expectCode(t, edit, manual.Name, sub.Migrate, "", http.StatusConflict, "not running")
		expectCode(t, edit, manual.Name, sub.Start, "", http.StatusOK, "start requested")
		if got := requests(t, manual.Name); !equalRequests(got, []v1alpha1.VirtualMachineStateChangeRequest{{Action: v1alpha1.StartRequest}}) {
			t.Errorf("stateChangeRequests: %+v", got)
		}
		paused := createVM(t, "paused", v1alpha1.RunStrategyManual)
		expectCode(t, edit, paused.Name, sub.Start, `{"paused": true}`, http.StatusOK, "start requested")
		want := []v1alpha1.VirtualMachineStateChangeRequest{{Action: v1alpha1.StartRequest,
			Data: map[string]string{v1alpha1.StartPausedDataKey: "true"}}}
		if got := requests(t, paused.Name); !equalRequests(got, want) {
			t.Errorf("stateChangeRequests after start --paused: %+v, want %+v", got, want)
		}
	})

	t.Run("migrate creates a migration", func(t *testing.T) {
		vm := createVM(t, "mover", v1alpha1.RunStrategyAlways)
		testVMI(t, vm.Name, "", v1alpha1.Running)
		_, body := expectCode(t, edit, vm.Name, sub.Migrate, "", http.StatusOK, "")
		var m v1alpha1.VirtualMachineInstanceMigration
		if err := json.Unmarshal(body, &m); err != nil || m.Kind != "VirtualMachineInstanceMigration" {
			t.Fatalf("answer is not a migration: %v %s", err, body)
		}
		if !strings.HasPrefix(m.Name, "mover-migration-") || m.Spec.VMIName != "mover" {
			t.Errorf("migration %s for %q", m.Name, m.Spec.VMIName)
		}
		stored := &v1alpha1.VirtualMachineInstanceMigration{}
		if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: m.Name}, stored); err != nil {
			t.Errorf("the migration is not stored: %v", err)
		}
		_ = cp.Client.Delete(context.Background(), stored)
		_, body = expectCode(t, edit, vm.Name, sub.Migrate, `{"dryRun": ["All"]}`, http.StatusOK, "")
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: m.Name}, stored); err == nil {
			t.Errorf("a dry run stored migration %s", m.Name)
		}
	})

	t.Run("migrate refuses an instance with a disk only its node has, naming it", func(t *testing.T) {
		vm := createVM(t, "scratchy", v1alpha1.RunStrategyAlways)
		vmi := testVMI(t, vm.Name, "", v1alpha1.Running)
		base := vmi.DeepCopy()
		vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
			HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/scratch.img", Type: v1alpha1.HostDiskExistsOrCreate, Capacity: ptr.To(resource.MustParse("8Mi"))}}})
		vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "scratch"})
		if err := cp.Client.Patch(context.Background(), vmi, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
		expectCode(t, edit, vm.Name, sub.Migrate, "", http.StatusConflict, `volume "scratch" is a host disk that is not marked shared`)
		var list v1alpha1.VirtualMachineInstanceMigrationList
		if err := cp.Client.List(context.Background(), &list, client.InNamespace(testNS)); err != nil {
			t.Fatal(err)
		}
		for _, m := range list.Items {
			if m.Spec.VMIName == vm.Name {
				t.Errorf("migration %s created for an instance that cannot migrate", m.Name)
			}
		}
	})

	t.Run("addvolume and removevolume", func(t *testing.T) {
		vm := createVM(t, "disks", v1alpha1.RunStrategyAlways)
		testVMI(t, vm.Name, "", v1alpha1.Running)
		add := `{"name": "scratch", "volumeSource": {"emptyDisk": {"capacity": "64Mi"}}}`
		expectCode(t, edit, vm.Name, sub.AddVolume, add, http.StatusOK, "hot-plugged")
		expectCode(t, edit, vm.Name, sub.AddVolume, add, http.StatusConflict, `named "scratch" already`)
		cur := getVM(t, vm.Name)
		if !hasDisk(&cur.Spec.Template.Spec, "scratch") {
			t.Errorf("template volumes %+v", cur.Spec.Template.Spec.Volumes)
		}
		vmi := &v1alpha1.VirtualMachineInstance{}
		if err := cp.Client.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: vm.Name}, vmi); err != nil || !hasDisk(&vmi.Spec, "scratch") {
			t.Errorf("VMI volumes %+v (%v)", vmi.Spec.Volumes, err)
		}

		stopped := createVM(t, "disks-stopped", v1alpha1.RunStrategyHalted)
		expectCode(t, edit, stopped.Name, sub.AddVolume, add, http.StatusOK, "added to the template")
		expectCode(t, edit, stopped.Name, sub.RemoveVolume, `{"name": "scratch"}`, http.StatusOK, "removed")
		expectCode(t, edit, stopped.Name, sub.RemoveVolume, `{"name": "scratch"}`, http.StatusConflict, `no volume named "scratch"`)
		if hasDisk(&getVM(t, stopped.Name).Spec.Template.Spec, "scratch") {
			t.Error("the volume is still in the template")
		}
	})

	t.Run("bad input", func(t *testing.T) {
		vm := createVM(t, "bad", v1alpha1.RunStrategyManual)
		expectCode(t, edit, "ghost", sub.Start, "", http.StatusNotFound, `"ghost" not found`)
		for _, tc := range []struct{ action, body, want string }{
			{sub.Stop, `{"gracePeriodSeconds": "soon"}`, "gracePeriodSeconds"},
			{sub.Stop, `{"gracePeriodSeconds": -1}`, "gracePeriodSeconds"},
			{sub.Stop, `{"grace": 1}`, `unknown field "grace"`},
			{sub.Stop, `{"force": true, "gracePeriodSeconds": 30}`, "gracePeriodSeconds: Invalid value: 30: must be 0 or unset with force"},
			{sub.Restart, `{"force": true, "gracePeriodSeconds": 5}`, "gracePeriodSeconds: Invalid value: 5: must be 0 or unset with force"},
			{sub.Start, `{"paused": "yes"}`, "paused"},
			{sub.Migrate, `{"dryRun": ["Some"]}`, "dryRun[0]"},
			{sub.AddVolume, `{"name": "x"}`, "volumeSource: Required"},
			{sub.AddVolume, `{"volumeSource": {"emptyDisk": {"capacity": "1Mi"}}}`, "name: Required"},
			{sub.AddVolume, `{"name": "x", "disk": {"cdrom": {}}, "volumeSource": {"emptyDisk": {"capacity": "1Mi"}}}`, "disk.cdrom"},
			{sub.AddVolume, `{"name": "x", "volumeSource": {"containerDisk": {"image": "a/b"}}}`, "volumeSource.containerDisk"},
			{sub.AddVolume, `{"name": "x"`, "not valid JSON"},
			{sub.RemoveVolume, `{"name": "Bad_Name"}`, "name: Invalid value"},
		} {
			expectCode(t, edit, vm.Name, tc.action, tc.body, http.StatusBadRequest, tc.want)
		}
	})
}

// expectCode PUTs body to a VM subresource and checks the code and that the answer contains want.
func expectCode(t *testing.T, cfg *rest.Config, name, action, body string, code int, want string) (int, []byte) {
	t.Helper()
	got, data := put(t, cfg, sub.VirtualMachines, name, action, body)
	text := string(data)
	var st metav1.Status
	if json.Unmarshal(data, &st) == nil && st.Kind == "Status" {
		text = st.Message
	} else if code != http.StatusOK {
		t.Errorf("%s %s: the answer is not a Status: %s", action, name, data)
	}
	if got != code || !strings.Contains(text, want) {
		t.Errorf("%s %s %s: %d %s, want %d containing %q", action, name, body, got, text, code, want)
	}
	return got, data
}

func createVM(t *testing.T, name string, rs v1alpha1.RunStrategy) *v1alpha1.VirtualMachine {
	t.Helper()
	req, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}}
	vm.Spec.RunStrategy = ptr.To(rs)
	vm.Spec.Template.Spec = req.Spec
	if err := cp.Client.Create(context.Background(), vm); err != nil {
		t.Fatalf("create VM %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), vm) })
	return vm
}

func getVM(t *testing.T, name string) *v1alpha1.VirtualMachine {
	t.Helper()
	vm := &v1alpha1.VirtualMachine{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: testNS, Name: name}, vm); err != nil {
		t.Fatal(err)
	}
	return vm
}

func requests(t *testing.T, name string) []v1alpha1.VirtualMachineStateChangeRequest {
	t.Helper()
	return getVM(t, name).Status.StateChangeRequests
}

func equalRequests(a, b []v1alpha1.VirtualMachineStateChangeRequest) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func hasDisk(spec *v1alpha1.VirtualMachineInstanceSpec, name string) bool {
	return slices.ContainsFunc(spec.Volumes, func(v v1alpha1.Volume) bool { return v.Name == name }) &&
		slices.ContainsFunc(spec.Domain.Devices.Disks, func(d v1alpha1.Disk) bool { return d.Name == name })
}
