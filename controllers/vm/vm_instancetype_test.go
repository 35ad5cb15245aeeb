package vm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
)

// instancetypeCases are the instancetype and preference cases of TestReconciler.
func instancetypeCases() []namedCase {
	return []namedCase{
		{"InstancetypeExpansion", testInstancetypeExpansion},
		{"InstancetypeRevisionPinning", testInstancetypeRevisionPinning},
		{"InstancetypeMissing", testInstancetypeMissing},
		{"InstancetypeConflict", testInstancetypeConflict},
	}
}

func (h *harness) createInstancetype(name string, vcpus uint32, mem string) error {
	it := &v1alpha1.VirtualMachineInstancetype{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1alpha1.VirtualMachineInstancetypeSpec{
			CPU:         v1alpha1.CPUInstancetype{Guest: vcpus, Model: ptr.To("qemu64")},
			Memory:      v1alpha1.MemoryInstancetype{Guest: resource.MustParse(mem)},
			Annotations: map[string]string{"example.com/size": name},
		},
	}
	if err := h.c.Create(h.ctx, it); err != nil {
		return fmt.Errorf("create instancetype: %w", err)
	}
	return nil
}

// createITVM creates a VM whose template sets neither CPU nor memory, with a disk and an
// interface that leave bus and model unset, referring to the instancetype (namespaced) and, when
// pref is not empty, to the cluster preference pref.
func (h *harness) createITVM(name, it, pref string, mutate func(*v1alpha1.VirtualMachine)) error {
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1alpha1.VirtualMachineSpec{
			RunStrategy:  ptr.To(v1alpha1.RunStrategyAlways),
			Instancetype: &v1alpha1.InstancetypeMatcher{Name: it, Kind: v1alpha1.InstancetypeKind},
			Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: v1alpha1.VirtualMachineInstanceSpec{
					Domain: v1alpha1.DomainSpec{Devices: v1alpha1.Devices{
						Disks:      []v1alpha1.Disk{{Name: "root", Disk: &v1alpha1.DiskTarget{}}},
						Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}},
					}},
					Volumes:  []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/disk:1"}}}},
					Networks: []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}},
					// The VM's own value wins over preferredTerminationGracePeriodSeconds.
					TerminationGracePeriodSeconds: ptr.To[int64](60),
				},
			},
		},
	}
	if pref != "" {
		vm.Spec.Preference = &v1alpha1.PreferenceMatcher{Name: pref}
	}
	if mutate != nil {
		mutate(vm)
	}
	if err := h.c.Create(h.ctx, vm); err != nil {
		return fmt.Errorf("create VM: %w", err)
	}
	return nil
}

func cpuOf(v *v1alpha1.VirtualMachineInstance) string {
	c := v.Spec.Domain.CPU
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("%d sockets, %d cores, %d threads, model %q", c.Sockets, c.Cores, c.Threads, c.Model)
}

// testInstancetypeExpansion: the VMI gets the instancetype's vCPUs (laid out as the preference's
// cores), model, memory and annotations, and the preference's defaults where the VM sets nothing
// (disk bus, interface model, rng, machine type), not where it does (grace period). The VM's status
// names the ControllerRevisions, owned by the VM, that hold the copies.
func testInstancetypeExpansion(h *harness) error {
	const name = "sized"
	if err := h.createInstancetype("medium", 4, "256Mi"); err != nil {
		return err
	}
	pref := &v1alpha1.VirtualMachineClusterPreference{
		ObjectMeta: metav1.ObjectMeta{Name: "pref-" + h.ns},
		Spec: v1alpha1.VirtualMachinePreferenceSpec{
			CPU: &v1alpha1.CPUPreferences{PreferredCPUTopology: ptr.To(v1alpha1.PreferCores)},
			Devices: &v1alpha1.DevicePreferences{
				PreferredDiskBus: v1alpha1.DiskBusSATA, PreferredInterfaceModel: "e1000",
				PreferredRng: &v1alpha1.Rng{}, PreferredBlockMultiQueue: ptr.To(true), PreferredNetworkInterfaceMultiQueue: ptr.To(true),
			},
			Machine:                                &v1alpha1.MachinePreferences{PreferredMachineType: "pc-q35-7.2"},
			PreferredTerminationGracePeriodSeconds: ptr.To[int64](30),
			Requirements:                           &v1alpha1.PreferenceRequirements{CPU: &v1alpha1.CPUPreferenceRequirement{Guest: 2}},
		},
	}
	if err := h.c.Create(h.ctx, pref); err != nil {
		return fmt.Errorf("create preference: %w", err)
	}
	defer h.c.Delete(h.ctx, pref)
	if err := h.createITVM(name, "medium", pref.Name, nil); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	d := vmi.Spec.Domain
	var problems []string
	if got := cpuOf(vmi); got != `1 sockets, 4 cores, 1 threads, model "qemu64"` {
		problems = append(problems, "cpu: "+got)
	}
	if d.Memory == nil || d.Memory.Guest == nil || d.Memory.Guest.String() != "256Mi" {
		problems = append(problems, fmt.Sprintf("memory %+v, want guest 256Mi", d.Memory))
	}
	if got := vmi.Annotations["example.com/size"]; got != "medium" {
		problems = append(problems, fmt.Sprintf("annotation example.com/size %q, want the instancetype's medium", got))
	}
	if t := d.Devices.Disks[0].Disk; t == nil || t.Bus != v1alpha1.DiskBusSATA {
		problems = append(problems, fmt.Sprintf("disk %+v, want the preferred sata bus", d.Devices.Disks[0]))
	}
	if m := d.Devices.Interfaces[0].Model; m != "e1000" {
		problems = append(problems, fmt.Sprintf("interface model %q, want the preferred e1000", m))
	}
	if d.Devices.Rng == nil || d.Devices.BlockMultiQueue == nil || !*d.Devices.BlockMultiQueue {
		problems = append(problems, "no rng or blockMultiQueue from the preference")
	}
	if mq := d.Devices.NetworkInterfaceMultiQueue; mq == nil || !*mq {
		problems = append(problems, "no networkInterfaceMultiqueue from the preference")
	}
	if d.Machine == nil || d.Machine.Type != "pc-q35-7.2" {
		problems = append(problems, fmt.Sprintf("machine %+v, want the preferred pc-q35-7.2", d.Machine))
	}
	if g := vmi.Spec.TerminationGracePeriodSeconds; g == nil || *g != 60 {
		problems = append(problems, fmt.Sprintf("terminationGracePeriodSeconds %v, want the VM's own 60", g))
	}
	if len(problems) > 0 {
		return fmt.Errorf("VMI not expanded as expected: %s", strings.Join(problems, "; "))
	}
	// The status is patched at the end of the pass that created the VMI.
	if err := h.waitVM(name, "status refs to the instancetype and preference", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.InstancetypeRef != nil && vm.Status.PreferenceRef != nil
	}); err != nil {
		return err
	}
	vm := &v1alpha1.VirtualMachine{}
	if err := h.c.Get(h.ctx, h.key(name), vm); err != nil {
		return err
	}
	for _, ref := range []*v1alpha1.InstancetypeStatusRef{vm.Status.InstancetypeRef, vm.Status.PreferenceRef} {
		if ref == nil || ref.ControllerRevisionRef == nil {
			return fmt.Errorf("VM status refs %+v / %+v, want both with a ControllerRevision", vm.Status.InstancetypeRef, vm.Status.PreferenceRef)
		}
		cr := &appsv1.ControllerRevision{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: ref.ControllerRevisionRef.Name}, cr); err != nil {
			return fmt.Errorf("ControllerRevision of %s %s: %w", ref.Kind, ref.Name, err)
		}
		if o := metav1.GetControllerOf(cr); o == nil || o.UID != vm.UID {
			return fmt.Errorf("ControllerRevision %s is not owned by the VM: %+v", cr.Name, cr.OwnerReferences)
		}
	}
	if vm.Status.InstancetypeRef.Kind != v1alpha1.InstancetypeKind || vm.Status.PreferenceRef.Kind != v1alpha1.ClusterPreferenceKind {
		return fmt.Errorf("status ref kinds %q and %q", vm.Status.InstancetypeRef.Kind, vm.Status.PreferenceRef.Kind)
	}
	return nil
}

// testInstancetypeRevisionPinning: the instancetype changes after the VM started; the VM does not
// ask for a restart, and its restarted VMI still has the values of the copy taken at first use.
func testInstancetypeRevisionPinning(h *harness) error {
	const name = "pinned"
	if err := h.createInstancetype("small", 2, "128Mi"); err != nil {
		return err
	}
	if err := h.createITVM(name, "small", "", nil); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	if got := cpuOf(vmi); got != `2 sockets, 1 cores, 1 threads, model "qemu64"` {
		return fmt.Errorf("first VMI cpu %s, want the instancetype's 2 vCPUs as sockets", got)
	}
	if err := h.setPhase(name, vmi.UID, v1alpha1.Running); err != nil {
		return err
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		it := &v1alpha1.VirtualMachineInstancetype{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "small"}, it); err != nil {
			return err
		}
		it.Spec.CPU.Guest, it.Spec.Memory.Guest = 8, resource.MustParse("1Gi")
		return h.c.Update(h.ctx, it)
	}); err != nil {
		return fmt.Errorf("edit instancetype: %w", err)
	}
	// Any change of the VM makes the controller look again; it must not pick up the edit.
	if err := h.updateVM(name, func(vm *v1alpha1.VirtualMachine) { vm.Labels = map[string]string{"touched": "yes"} }); err != nil {
		return err
	}
	if err := h.holds(time.Second, "no RestartRequired after the instancetype changed", func() error {
		return h.checkVM(name, func(vm *v1alpha1.VirtualMachine) bool {
			return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired) == nil
		})
	}); err != nil {
		return err
	}
	if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &vmi.UID},
		v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
		return err
	}
	next, err := h.waitVMI(name, "the restarted VMI", func(v *v1alpha1.VirtualMachineInstance) bool { return v.UID != vmi.UID })
	if err != nil {
		return err
	}
	if got := cpuOf(next); got != `2 sockets, 1 cores, 1 threads, model "qemu64"` {
		return fmt.Errorf("restarted VMI cpu %s, want the pinned 2 vCPUs", got)
	}
	if got := next.Spec.Domain.Memory.Guest.String(); got != "128Mi" {
		return fmt.Errorf("restarted VMI memory %s, want the pinned 128Mi", got)
	}
	return nil
}

// testInstancetypeMissing: a VM naming an instancetype that does not exist gets no VMI and a
// Failure condition naming it; once the instancetype exists, the VM starts.
func testInstancetypeMissing(h *harness) error {
	const name = "unsized"
	if err := h.createITVM(name, "absent", "", nil); err != nil {
		return err
	}
	if err := h.waitVM(name, "Failure naming the missing instancetype", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure)
		return c != nil && c.Reason == instancetype.ReasonInstancetypeNotFound &&
			strings.Contains(c.Message, `VirtualMachineInstancetype "absent" not found in namespace `+h.ns) &&
			strings.HasPrefix(c.Message, "spec.instancetype: ")
	}); err != nil {
		return err
	}
	if _, err := h.getVMI(name); err == nil {
		return fmt.Errorf("a VMI exists for a VM whose instancetype is missing")
	}
	if err := h.createInstancetype("absent", 1, "64Mi"); err != nil {
		return err
	}
	if _, err := pollLonger(h, func() (*v1alpha1.VirtualMachineInstance, error) { return h.getVMI(name) }); err != nil {
		return fmt.Errorf("no VMI once the instancetype exists: %w", err)
	}
	return h.waitVM(name, "the Failure condition cleared", func(vm *v1alpha1.VirtualMachine) bool {
		return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure) == nil
	})
}

// pollLonger waits up to twice the expansion recheck for get to succeed.
func pollLonger(h *harness, get func() (*v1alpha1.VirtualMachineInstance, error)) (*v1alpha1.VirtualMachineInstance, error) {
	deadline := time.Now().Add(2 * expandRecheck)
	for {
		v, err := get()
		if err == nil || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testInstancetypeConflict: a VM (admitted without the webhook) whose template sets the sockets
// and the memory its instancetype sets gets no VMI and a Failure naming both fields.
func testInstancetypeConflict(h *harness) error {
	const name = "clash"
	if err := h.createInstancetype("fixed", 2, "128Mi"); err != nil {
		return err
	}
	if err := h.createITVM(name, "fixed", "", func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2}
		vm.Spec.Template.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}
	}); err != nil {
		return err
	}
	if err := h.waitVM(name, "Failure naming the conflicting fields", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure)
		return c != nil && c.Reason == instancetype.ReasonConflict &&
			strings.Contains(c.Message, "spec.template.spec.domain.cpu.sockets") &&
			strings.Contains(c.Message, "spec.template.spec.domain.memory.guest")
	}); err != nil {
		return err
	}
	if _, err := h.getVMI(name); err == nil {
		return fmt.Errorf("a VMI exists for a VM that conflicts with its instancetype")
	}
	return nil
}

// countingReader answers Get from objs (NotFound otherwise) and counts the calls.
type countingReader struct {
	objs  map[client.ObjectKey]client.Object
	calls int
}

func (c *countingReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.calls++
	o, ok := c.objs[key]
	if !ok {
		return apierrors.NewNotFound(appsv1.Resource("controllerrevisions"), key.Name)
	}
	o.(*appsv1.ControllerRevision).DeepCopyInto(obj.(*appsv1.ControllerRevision))
	return nil
}

func (c *countingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return nil
}

// A pinned revision the cache holds costs the API server nothing; one the cache does not hold yet
// (just created) is read from the API server rather than taken as gone, which would re-pin the VM.
func TestCacheFirst(t *testing.T) {
	key := client.ObjectKey{Namespace: "ns", Name: "vm-u1-small-1"}
	rev := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Revision: 1}
	inCache := &countingReader{objs: map[client.ObjectKey]client.Object{key: rev}}
	api := &countingReader{objs: map[client.ObjectKey]client.Object{key: rev}}
	var got appsv1.ControllerRevision
	if err := (cacheFirst{cache: inCache, api: api}).Get(context.Background(), key, &got); err != nil || got.Revision != 1 {
		t.Fatalf("from the cache: %v, %+v", err, got)
	}
	if api.calls != 0 {
		t.Errorf("a revision in the cache was also read from the API server (%d GETs)", api.calls)
	}
	lagging := &countingReader{}
	got = appsv1.ControllerRevision{}
	if err := (cacheFirst{cache: lagging, api: api}).Get(context.Background(), key, &got); err != nil || got.Revision != 1 {
		t.Fatalf("a revision the cache does not hold yet: %v, %+v; want it from the API server", err, got)
	}
	missing := client.ObjectKey{Namespace: "ns", Name: "gone"}
	if err := (cacheFirst{cache: lagging, api: api}).Get(context.Background(), missing, &got); !apierrors.IsNotFound(err) {
		t.Errorf("a revision neither holds: %v, want NotFound", err)
	}
}
