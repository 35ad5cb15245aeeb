package admission_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
)

// KubeVirt-shaped manifests, written from KubeVirt's documentation and examples with only the
// apiVersion changed: what KubeVirt leaves to its defaults is left out.

// kvVMI is an instance with a containerDisk and cloud-init user data but no disk for the latter,
// no network, resources instead of memory.guest and a CPU topology, an empty machine type, and an
// ISO attached as a cdrom that says readonly: false.
const kvVMI = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: kv-defaults
spec:
  domain:
    machine:
      type: ""
    resources:
      requests:
        memory: 128Mi
        cpu: "2"
    devices:
      disks:
      - name: containerdisk
        disk: {}
      - name: iso
        cdrom:
          readonly: false
  volumes:
  - name: containerdisk
    containerDisk:
      image: quay.io/kubevirt/cirros-container-disk-demo:v1.4.0
  - name: iso
    emptyDisk:
      capacity: 1Mi
  - name: cloudinitdisk
    cloudInitNoCloud:
      userData: |
        #cloud-config
        password: cirros
`

// kvVM is a VirtualMachine in the shape of KubeVirt's vm-cirros example, its cloud-init volume
// without a disk and its machine without a type.
const kvVM = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachine
metadata:
  name: kv-defaults-vm
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        machine: {}
        resources:
          requests:
            memory: 64Mi
        devices:
          disks:
          - name: containerdisk
            disk:
              bus: virtio
      volumes:
      - name: containerdisk
        containerDisk:
          image: quay.io/kubevirt/cirros-container-disk-demo:v1.4.0
      - name: cloudinitdisk
        cloudInitNoCloud:
          userData: |
            #cloud-config
            password: cirros
`

// kvDevices has the devices of KubeVirt's documentation (virtual hardware, watchdog): an entropy
// device, tablets, a watchdog and the APIC, each leaving what it can to the defaults.
const kvDevices = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: kv-devices
spec:
  domain:
    features:
      apic: {}
    memory:
      guest: 64Mi
    devices:
      rng: {}
      inputs:
      - type: tablet
        bus: virtio
        name: tablet1
      - name: tablet2
      watchdog:
        name: mywatchdog
        i6300esb: {}
      sound:
        name: speaker
      autoattachPodInterface: false
`

// kvHyperv asks for synthetic timers only: KubeVirt's webhook stores synic and vpindex with them.
const kvHyperv = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: kv-hyperv
spec:
  domain:
    features:
      hyperv:
        synictimer: {}
        spinlocks: {}
    clock:
      utc: {}
      timer:
        hyperv: {}
    memory:
      guest: 64Mi
    devices:
      autoattachPodInterface: false
`

// TestDefaultsRecorded creates KubeVirt-shaped objects through kube-apiserver with the webhooks
// installed and reads them back as `kubectl get -o yaml` shows them: an instance stores
// KubeVirt's defaults, a VirtualMachine its template's machine type only (KubeVirt's VM mutator),
// the rest going to the instances it creates.
func TestDefaultsRecorded(t *testing.T) {
	startWebhook(t)
	kubectl := kubectlDefault

	t.Run("an instance stores every default", func(t *testing.T) {
		_, stderr, err := kubectl([]byte(kvVMI), "create", "-f", "-")
		if err != nil {
			t.Fatalf("refused: %v: %s", err, stderr)
		}
		t.Cleanup(func() { _, _, _ = kubectl(nil, "delete", "vmi", "kv-defaults", "--wait=false") })
		if !strings.Contains(stderr, `cdrom "iso" has readonly: false`) {
			t.Errorf("no warning about the writable cdrom: %q", stderr)
		}
		var vmi v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-defaults", &vmi)
		s, d := vmi.Spec, vmi.Spec.Domain
		checks := []struct{ field, got, want string }{
			{"domain.machine.type", d.Machine.Type, "q35"},
			{"domain.memory.guest", d.Memory.Guest.String(), "128Mi"},
			{"terminationGracePeriodSeconds", i64(s.TerminationGracePeriodSeconds), "180"},
			{"domain.devices.disks", diskList(d.Devices.Disks), "containerdisk:disk:virtio iso:cdrom:sata:readonly=false cloudinitdisk:disk:virtio"},
			{"domain.devices.interfaces", ifaceList(d.Devices.Interfaces), "default:virtio:masquerade"},
			{"networks", netList(s.Networks), "default:pod"},
			{"domain.devices.autoattachSerialConsole", b(d.Devices.AutoattachSerialConsole), "true"},
			{"domain.devices.autoattachGraphicsDevice", b(d.Devices.AutoattachGraphicsDevice), "true"},
			{"domain.devices.autoattachMemBalloon", b(d.Devices.AutoattachMemBalloon), "true"},
		}
		if d.CPU == nil {
			t.Fatal("domain.cpu not stored")
		}
		checks = append(checks, struct{ field, got, want string }{"domain.cpu sockets/cores/threads",
			strings.Join([]string{u32(d.CPU.Sockets), u32(d.CPU.Cores), u32(d.CPU.Threads)}, "/"), "2/1/1"})
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("stored spec.%s = %q, want %q", c.field, c.got, c.want)
			}
		}
		// Given at creation, so the controller's first pass writes nothing for it.
		if got := strings.Join(vmi.Finalizers, ","); got != v1alpha1.GracefulShutdownFinalizer {
			t.Errorf("stored metadata.finalizers %q, want %q", got, v1alpha1.GracefulShutdownFinalizer)
		}
	})

	t.Run("devices store KubeVirt's defaults", func(t *testing.T) {
		createByKubectl(t, []byte(kvDevices), "vmi", "kv-devices")
		var vmi v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-devices", &vmi)
		d := vmi.Spec.Domain
		var inputs []string
		for _, in := range d.Devices.Inputs {
			inputs = append(inputs, in.Name+":"+string(in.Bus)+":"+string(in.Type))
		}
		if got := strings.Join(inputs, " "); got != "tablet1:virtio:tablet tablet2:usb:tablet" {
			t.Errorf("stored inputs %q, want tablet2 on usb by default", got)
		}
		if w := d.Devices.Watchdog; w == nil || w.I6300ESB == nil || w.I6300ESB.Action != v1alpha1.WatchdogActionReset {
			t.Errorf("stored watchdog %+v, want i6300esb with action reset", w)
		}
		if d.Devices.Rng == nil {
			t.Error("rng not stored")
		}
		if a := d.Features.APIC; a == nil || b(a.Enabled) != "true" {
			t.Errorf("stored apic %+v, want enabled: true", a)
		}
		if snd := d.Devices.Sound; snd == nil || snd.Model != v1alpha1.SoundModelICH9 {
			t.Errorf("stored sound %+v, want model ich9", snd)
		}
	})

	t.Run("autoattachInputDevice stores a tablet, autoattachMemBalloon false no balloon", func(t *testing.T) {
		createByKubectl(t, []byte(`apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: kv-autoattach}
spec:
  domain:
    memory: {guest: 64Mi}
    devices: {autoattachInputDevice: true, autoattachMemBalloon: false, autoattachPodInterface: false}
`), "vmi", "kv-autoattach")
		var vmi v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-autoattach", &vmi)
		dev := vmi.Spec.Domain.Devices
		if in := dev.Inputs; len(in) != 1 || in[0].Name != "default-0" || in[0].Bus != v1alpha1.InputBusUSB || in[0].Type != v1alpha1.InputTypeTablet {
			t.Errorf("stored inputs %+v, want KubeVirt's default-0 USB tablet", in)
		}
		if b(dev.AutoattachMemBalloon) != "false" {
			t.Errorf("stored autoattachMemBalloon %s, want false as written", b(dev.AutoattachMemBalloon))
		}
		m, err := translate.Machine(&vmi, translate.Host{Emulation: true})
		if err != nil {
			t.Fatal(err)
		}
		if m.MemBalloon || len(m.Inputs) != 1 {
			t.Errorf("machine balloon %v inputs %+v, want no balloon and the tablet", m.MemBalloon, m.Inputs)
		}
	})

	t.Run("the Hyper-V features an enabled one needs are stored", func(t *testing.T) {
		createByKubectl(t, []byte(kvHyperv), "vmi", "kv-hyperv")
		var vmi v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-hyperv", &vmi)
		h := vmi.Spec.Domain.Features.Hyperv
		if h.VPIndex == nil || b(h.VPIndex.Enabled) != "true" || h.SyNIC == nil || b(h.SyNIC.Enabled) != "true" || b(h.SyNICTimer.Enabled) != "true" {
			t.Errorf("stored hyperv %+v: want vpindex, synic and synictimer enabled", h)
		}
		if r := h.Spinlocks.Retries; r == nil || *r != 4096 {
			t.Errorf("stored spinlock retries %v, want 4096", r)
		}
	})

	t.Run("autoattachPodInterface false leaves the instance without a network", func(t *testing.T) {
		o := sample(t, "vmi_testguest.yaml")
		spec := o["spec"].(map[string]any)
		devices := spec["domain"].(map[string]any)["devices"].(map[string]any)
		delete(devices, "interfaces")
		delete(spec, "networks")
		devices["autoattachPodInterface"] = false
		o["metadata"].(map[string]any)["name"] = "kv-nonet"
		data, _ := json.Marshal(o)
		createByKubectl(t, data, "vmi", "kv-nonet")
		var vmi v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-nonet", &vmi)
		if len(vmi.Spec.Domain.Devices.Interfaces) != 0 || len(vmi.Spec.Networks) != 0 {
			t.Fatalf("interfaces %+v, networks %+v: want none", vmi.Spec.Domain.Devices.Interfaces, vmi.Spec.Networks)
		}
	})

	t.Run("a VM stores its template's machine type, its instance the rest", func(t *testing.T) {
		createByKubectl(t, []byte(kvVM), "vm", "kv-defaults-vm")
		var vm v1alpha1.VirtualMachine
		get(t, "vm", "kv-defaults-vm", &vm)
		tmpl := vm.Spec.Template.Spec
		if m := tmpl.Domain.Machine; m == nil || m.Type != "q35" {
			t.Errorf("stored template machine %+v, want type q35", m)
		}
		if got := diskList(tmpl.Domain.Devices.Disks); got != "containerdisk:disk:virtio" {
			t.Errorf("stored template disks %q: want them as written (the instance gets the defaults)", got)
		}
		if tmpl.TerminationGracePeriodSeconds != nil || len(tmpl.Networks) != 0 || tmpl.Domain.Memory != nil {
			t.Errorf("the template got more than its machine type: %+v", tmpl)
		}

		// The instance the VM controller creates from it: its template's spec.
		vmi := v1alpha1.VirtualMachineInstance{TypeMeta: typeMeta("VirtualMachineInstance")}
		vmi.Name, vmi.Spec = "kv-defaults-vm", tmpl
		data, _ := json.Marshal(vmi)
		createByKubectl(t, data, "vmi", "kv-defaults-vm")
		var got v1alpha1.VirtualMachineInstance
		get(t, "vmi", "kv-defaults-vm", &got)
		if l := diskList(got.Spec.Domain.Devices.Disks); l != "containerdisk:disk:virtio cloudinitdisk:disk:virtio" {
			t.Errorf("the instance's disks %q: want the cloud-init volume attached as a virtio disk", l)
		}
		if g := got.Spec.Domain.Memory; g == nil || g.Guest.Cmp(resource.MustParse("64Mi")) != 0 {
			t.Errorf("the instance's memory %+v, want guest 64Mi", g)
		}

		// The VM mutator defaults on update too: a machine type removed comes back.
		patch := `[{"op":"remove","path":"/spec/template/spec/domain/machine"}]`
		if _, stderr, err := kubectl(nil, "patch", "vm", "kv-defaults-vm", "--type=json", "-p", patch); err != nil {
			t.Fatalf("patch: %v: %s", err, stderr)
		}
		get(t, "vm", "kv-defaults-vm", &vm)
		if m := vm.Spec.Template.Spec.Domain.Machine; m == nil || m.Type != "q35" {
			t.Errorf("after the update, machine %+v, want type q35", m)
		}
	})
}

// get reads kind/name as `kubectl get -o json` prints it into out.
func get(t *testing.T, kind, name string, out any) {
	t.Helper()
	stdout, stderr, err := kubectlDefault(nil, "get", kind, name, "-o", "json")
	if err != nil {
		t.Fatalf("get %s %s: %v: %s", kind, name, err, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("decode %s %s: %v", kind, name, err)
	}
}

func diskList(disks []v1alpha1.Disk) string {
	var out []string
	for _, d := range disks {
		switch {
		case d.Disk != nil:
			out = append(out, d.Name+":disk:"+string(d.Disk.Bus))
		case d.CDRom != nil:
			out = append(out, d.Name+":cdrom:"+string(d.CDRom.Bus)+":readonly="+b(d.CDRom.ReadOnly))
		case d.LUN != nil:
			out = append(out, d.Name+":lun:"+string(d.LUN.Bus))
		default:
			out = append(out, d.Name+":no target")
		}
	}
	return strings.Join(out, " ")
}

func ifaceList(ifaces []v1alpha1.Interface) string {
	var out []string
	for _, in := range ifaces {
		binding := "none"
		if in.Masquerade != nil {
			binding = "masquerade"
		} else if in.Bridge != nil {
			binding = "bridge"
		} else if in.Binding != nil {
			binding = "binding=" + in.Binding.Name
		}
		out = append(out, in.Name+":"+in.Model+":"+binding)
	}
	return strings.Join(out, " ")
}

func netList(nets []v1alpha1.Network) string {
	var out []string
	for _, n := range nets {
		kind := "multus"
		if n.Pod != nil {
			kind = "pod"
		}
		out = append(out, n.Name+":"+kind)
	}
	return strings.Join(out, " ")
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind}
}

func b(v *bool) string {
	if v == nil {
		return "<unset>"
	}
	return strconv.FormatBool(*v)
}

func i64(v *int64) string {
	if v == nil {
		return "<unset>"
	}
	return strconv.FormatInt(*v, 10)
}

func u32(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// kvNoEffect is a VirtualMachine with the settings KubeVirt accepts and libvirt drops: the APIC
// turned off, an HPET tick policy and the RTC left out.
const kvNoEffect = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachine
metadata:
  name: kv-no-effect
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        features:
          apic:
            enabled: false
        clock:
          utc: {}
          timer:
            hpet:
              tickPolicy: catchup
            rtc:
              present: false
        memory:
          guest: 64Mi
        devices: {}
`

// TestKubeVirtNoEffectSettings: kubectl creates a VirtualMachine with what KubeVirt accepts but
// libvirt drops, and prints a warning naming each such field.
func TestKubeVirtNoEffectSettings(t *testing.T) {
	startWebhook(t)
	_, stderr, err := kubectlDefault([]byte(kvNoEffect), "create", "-f", "-")
	if err != nil {
		t.Fatalf("refused: %v: %s", err, stderr)
	}
	t.Cleanup(func() { _, _, _ = kubectlDefault(nil, "delete", "vm", "kv-no-effect", "--wait=false") })
	for _, want := range []string{
		"spec.template.spec.domain.features.apic.enabled: false has no effect",
		"spec.template.spec.domain.clock.timer.hpet.tickPolicy: catchup has no effect",
		"spec.template.spec.domain.clock.timer.rtc.present: false has no effect",
	} {
		if !strings.Contains(stderr, "Warning: "+want) {
			t.Errorf("kubectl printed no warning %q: %q", want, stderr)
		}
	}
}
