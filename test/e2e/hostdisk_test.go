package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestHostDisk: with qvirt-config allowing a host directory and enabling hostDisk for the test's
// namespace, a VM with a DiskOrCreate hostDisk in <allowed path>/<namespace>/ runs; the node agent
// created the image there, sparse at its capacity; the guest's write to the disk is in that file
// on the host, and after a restart of the VM the guest reads it back. A VM naming an image in
// another namespace's directory is refused by `kubectl apply`, naming the field. The settings only
// concern hostDisk and this namespace, so the test runs beside others; it restores them at the end.
func TestHostDisk(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	allowed := t.TempDir() // removed at the end, with what the nodes created in it
	enableHostDisk(t, allowed, ns)
	image := filepath.Join(allowed, ns, "disk.img")
	const name = "hostdisk"

	vm := withHostDisk(demoVM(t, ns, name, v1alpha1.RunStrategyAlways), image)
	// Admission refuses the VM until qvirt-controller has read the new configuration.
	applyEventually(t, vm)
	first := waitVMI(t, ns, name, bootTimeout, "Running", running(""))
	c := console(t, first)
	at := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, "printf QVIRT-HOSTDISK-1 > /dev/vda; sync; echo WROTE-$((1+1))")
	c.Expect(t, at, "WROTE-2", time.Minute)

	st, err := os.Stat(image)
	if err != nil {
		t.Fatalf("the hostDisk image is not on the host under the namespace's directory: %v", err)
	}
	if st.Size() != 64<<20 {
		t.Errorf("%s is %d bytes, want the capacity, 64 MiB", image, st.Size())
	}
	if used := st.Sys().(*syscall.Stat_t).Blocks * 512; used > st.Size()/16 {
		t.Errorf("%s is not sparse: %d bytes allocated for its %d", image, used, st.Size())
	}
	testutil.Eventually(t, 10*time.Second, "the guest's write in "+image, func() bool {
		head := make([]byte, 16)
		f, err := os.Open(image)
		if err != nil {
			return false
		}
		defer f.Close()
		_, err = f.ReadAt(head, 0)
		return err == nil && string(head) == "QVIRT-HOSTDISK-1"
	})

	request(t, ns, name, stopReq(first.UID), startReq)
	second := waitVMI(t, ns, name, bootTimeout, "Running after the restart", running(first.UID))
	c = console(t, second)
	at = c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, "head -c 16 /dev/vda; echo; echo READ-$((1+1))")
	end := c.Expect(t, at, "READ-2", time.Minute)
	if got := c.Text()[at:end]; !strings.Contains(got, "QVIRT-HOSTDISK-1") {
		t.Errorf("after the restart the guest reads %q from its hostDisk, want QVIRT-HOSTDISK-1", got)
	}

	t.Run("another namespace's directory is refused", func(t *testing.T) {
		other := withHostDisk(demoVM(t, ns, "otherns", v1alpha1.RunStrategyAlways), filepath.Join(allowed, "e2e-someone-else", "disk.img"))
		field := "spec.template.spec.volumes[" + strconv.Itoa(len(other.Spec.Template.Spec.Volumes)-1) + "].hostDisk.path"
		// Every qvirt-controller replica serves the webhook, and kube-apiserver picks one at
		// random for each request: ten tries reach both (but for one chance in 512), so a replica
		// that missed the configuration change refuses for the wrong reason here.
		for range 10 {
			out, err := applyErr(other.DeepCopy())
			if err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), filepath.Join(allowed, ns)+"/") {
				t.Fatalf("kubectl apply of a VM whose hostDisk is in another namespace's directory: %v %s; want it refused naming %s and this namespace's directory", err, out, field)
			}
		}
		_, err := applyErr(other.DeepCopy())
		t.Logf("refused: %v", err)
		if _, err := os.Stat(filepath.Join(allowed, "e2e-someone-else")); err == nil {
			t.Error("the other namespace's directory was created")
		}
	})
}

// withHostDisk adds a 64 MiB DiskOrCreate hostDisk at path to vm, as its first virtio disk.
func withHostDisk(vm *v1alpha1.VirtualMachine, path string) *v1alpha1.VirtualMachine {
	spec := &vm.Spec.Template.Spec
	capacity := resource.MustParse("64Mi")
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "host",
		Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "host", VolumeSource: v1alpha1.VolumeSource{
		HostDisk: &v1alpha1.HostDisk{Path: path, Type: v1alpha1.HostDiskExistsOrCreate, Capacity: &capacity}}})
	return vm
}

// enableHostDisk sets allowedHostPaths to dir and hostDiskNamespaces to ns in qvirt-config, and puts
// back the values it found when the test ends.
func enableHostDisk(t *testing.T, dir, ns string) {
	t.Helper()
	ctx := context.Background()
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: config.ConfigMapName}, &cm); err != nil {
		t.Fatalf("ConfigMap %s: %v", config.ConfigMapName, err)
	}
	keys := []string{"allowedHostPaths", "hostDiskNamespaces"}
	before := map[string]any{}
	for _, k := range keys {
		before[k] = nil // absent: the merge patch removes it
		if v, ok := cm.Data[k]; ok {
			before[k] = v
		}
	}
	patchConfig(t, map[string]any{"allowedHostPaths": dir, "hostDiskNamespaces": ns})
	t.Cleanup(func() { patchConfig(t, before) })
}

func patchConfig(t *testing.T, data map[string]any) {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: cluster.Namespace}}
	if err := cl.Patch(context.Background(), cm, client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatalf("patch ConfigMap %s with %s: %v", config.ConfigMapName, raw, err)
	}
}

// applyErr is applyVM returning kubectl's error (with its output) instead of failing.
func applyErr(vm *v1alpha1.VirtualMachine) (string, error) {
	vm.APIVersion, vm.Kind = v1alpha1.GroupVersion.String(), "VirtualMachine"
	data, err := yaml.Marshal(vm)
	if err != nil {
		return "", err
	}
	return ec.RunErr(data, kubectl, "apply", "-f", "-")
}

// applyEventually applies vm until admission lets it in (for up to 30 s: a configuration change
// reaches every qvirt-controller replica through its watch).
func applyEventually(t *testing.T, vm *v1alpha1.VirtualMachine) {
	t.Helper()
	var last error
	testutil.Eventually(t, 30*time.Second, "VM "+vm.Name+" admitted", func() bool {
		_, last = applyErr(vm.DeepCopy())
		return last == nil
	}, func() string { return "last refusal: " + errString(last) })
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
