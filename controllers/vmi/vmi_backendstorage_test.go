package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// persistentVMI is an instance whose TPM and EFI variables persist.
func persistentVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	v := newVMI(ns, name)
	v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
	v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}}
	return v
}

// TestBackendStorage: an instance with a persistent TPM and EFI variables gets KubeVirt's
// backend-storage claim (persistent-state-for-<name>: 10Mi, filesystem, ReadWriteMany of the
// configured vmStateStorageClass, or ReadWriteOnce of the cluster's default when none is
// configured), controlled by its VM, or by itself when no VM (only some other controller) owns
// it; its launcher pod mounts the claim writable at the launcher's state directory; it is
// live-migratable on a ReadWriteMany claim, which source and target pods both mount, and not on a
// ReadWriteOnce one, saying why; and a claim of that name that exists already is used as it is.
func TestBackendStorage(t *testing.T) {
	ns := newNamespace(t)
	cfg := config.Default()
	cfg.UseEmulation, cfg.VMStateStorageClass = true, "vm-state"
	store := config.NewStore(cfg)
	startManager(t, ns, store, cp.Config)
	ctx := context.Background()

	owned := persistentVMI(ns, "owned")
	vmRef := metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "owned",
		UID: types.UID("4b7c9a52-0d61-4d2e-9f1e-3c5a8b2d7e10"), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	owned.OwnerReferences = []metav1.OwnerReference{vmRef}
	alone := persistentVMI(ns, "alone")
	alone.Spec.Domain.Firmware = nil // the TPM alone asks for the claim too
	// Controlled by something that is not a VM (a pool, say): the claim is the instance's, not
	// the pool's, which would keep it past the instance under a name the next one never uses.
	pooled := persistentVMI(ns, "pooled")
	pooled.OwnerReferences = []metav1.OwnerReference{{APIVersion: "pool.example.com/v1", Kind: "VirtualMachinePool", Name: "pool",
		UID: types.UID("0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"), Controller: ptr.To(true)}}
	for _, v := range []*v1alpha1.VirtualMachineInstance{owned, alone, pooled} {
		if err := cp.Client.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
	}

	for _, v := range []*v1alpha1.VirtualMachineInstance{owned, alone, pooled} {
		pod := waitPod(t, v)
		name := "persistent-state-for-" + v.Name
		pvc := getClaim(t, ns, name)
		checkStateClaim(t, pvc, corev1.ReadWriteMany, "vm-state")
		owner := metav1.GetControllerOf(pvc)
		wantUID := getVMI(t, v).UID
		if v == owned {
			wantUID = vmRef.UID
		}
		if owner == nil || owner.UID != wantUID {
			t.Errorf("claim %s is controlled by %+v; want UID %s", name, owner, wantUID)
		}
		checkStateMount(t, pod, name)
		eventually(t, "LiveMigratable=True for "+v.Name+" on its ReadWriteMany claim", func() (bool, string) {
			c := migratable(t, v)
			return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("%+v", c)
		})
	}

	// Persistent EFI variables alone, likewise.
	efiShared := persistentVMI(ns, "efi-shared")
	efiShared.Spec.Domain.Devices.TPM = nil
	if err := cp.Client.Create(ctx, efiShared); err != nil {
		t.Fatal(err)
	}
	waitPod(t, efiShared)
	eventually(t, "LiveMigratable=True for efi-shared", func() (bool, string) {
		c := migratable(t, efiShared)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("%+v", c)
	})

	// A claim of the name exists already (the VM's, from its last instance): used as it is.
	createClaim(t, ns, "persistent-state-for-again", corev1.ReadWriteMany, corev1.PersistentVolumeFilesystem)
	again := persistentVMI(ns, "again")
	if err := cp.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitPod(t, again)
	pvc := getClaim(t, ns, "persistent-state-for-again")
	if !pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("1Gi")) || len(pvc.OwnerReferences) != 0 {
		t.Errorf("the existing claim was changed: %+v", pvc)
	}

	// No class configured: the cluster's default, which may offer ReadWriteOnce only.
	cfg.VMStateStorageClass = ""
	store.Set(cfg)
	byDefault := persistentVMI(ns, "by-default")
	if err := cp.Client.Create(ctx, byDefault); err != nil {
		t.Fatal(err)
	}
	checkStateMount(t, waitPod(t, byDefault), "persistent-state-for-by-default")
	checkStateClaim(t, getClaim(t, ns, "persistent-state-for-by-default"), corev1.ReadWriteOnce, "")
	eventually(t, "LiveMigratable=False for by-default", func() (bool, string) {
		c := migratable(t, byDefault)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PersistentStateReason &&
			strings.Contains(c.Message, "devices.tpm.persistent: the backend-storage claim persistent-state-for-by-default has access modes [ReadWriteOnce]"), fmt.Sprintf("%+v", c)
	})
	// A ReadWriteOnce claim keeps persistent EFI variables, and so the instance, on its node.
	efiLocal := persistentVMI(ns, "efi-local")
	efiLocal.Spec.Domain.Devices.TPM = nil
	if err := cp.Client.Create(ctx, efiLocal); err != nil {
		t.Fatal(err)
	}
	waitPod(t, efiLocal)
	eventually(t, "LiveMigratable=False for efi-local", func() (bool, string) {
		c := migratable(t, efiLocal)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PersistentStateReason &&
			strings.Contains(c.Message, "persistent-state-for-efi-local has access modes [ReadWriteOnce]"), fmt.Sprintf("%+v", c)
	})
}

// TestBackendStorageUnusable: an existing claim of the backend-storage name that cannot hold the
// instance's state gets no launcher pod, only a Synchronized=False condition naming the claim and
// why: a block claim, a claim another VM controls (its state is not this VM's), a claim being
// deleted; the last gets the pod, on a claim made afresh, once the old one is gone.
func TestBackendStorageUnusable(t *testing.T) {
	ns := newNamespace(t)
	cfg := config.Default()
	cfg.UseEmulation = true
	startManager(t, ns, config.NewStore(cfg), cp.Config)
	ctx := context.Background()

	createClaim(t, ns, "persistent-state-for-block", corev1.ReadWriteOnce, corev1.PersistentVolumeBlock)
	createClaim(t, ns, "persistent-state-for-foreign", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	foreign := getClaim(t, ns, "persistent-state-for-foreign")
	foreign.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "foreign",
		UID: types.UID("9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"), Controller: ptr.To(true)}}
	if err := cp.Client.Update(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	createClaim(t, ns, "persistent-state-for-going", corev1.ReadWriteOnce, corev1.PersistentVolumeFilesystem)
	going := getClaim(t, ns, "persistent-state-for-going")
	going.Finalizers = []string{"test.qvirt.io/hold"}
	if err := cp.Client.Update(ctx, going); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, going); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{"block": "volumeMode Block", "foreign": "is controlled by VirtualMachine foreign", "going": "is being deleted"}
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	for name := range want {
		vmis[name] = persistentVMI(ns, name)
		if err := cp.Client.Create(ctx, vmis[name]); err != nil {
			t.Fatal(err)
		}
	}
	for name, msg := range want {
		eventually(t, "a backend-storage condition on "+name, func() (bool, string) {
			c := findCondition(getVMI(t, vmis[name]), v1alpha1.VirtualMachineInstanceSynchronized)
			if c == nil {
				return false, "no Synchronized condition"
			}
			return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.BackendStorageReason &&
				strings.Contains(c.Message, "persistent-state-for-"+name) && strings.Contains(c.Message, msg), c.Reason + ": " + c.Message
		})
		if pods := podsOf(t, vmis[name]); len(pods) != 0 {
			t.Errorf("%s got a launcher pod on an unusable claim", name)
		}
	}

	going = getClaim(t, ns, "persistent-state-for-going")
	going.Finalizers = nil
	if err := cp.Client.Update(ctx, going); err != nil {
		t.Fatal(err)
	}
	checkStateMount(t, waitPod(t, vmis["going"]), "persistent-state-for-going")
	fresh := getClaim(t, ns, "persistent-state-for-going")
	if fresh.UID == going.UID || metav1.GetControllerOf(fresh) == nil {
		t.Errorf("the claim after the deleted one is %+v; want a new one the instance controls", fresh.ObjectMeta)
	}
	eventually(t, "the backend-storage condition to go once the claim is usable", func() (bool, string) {
		c := findCondition(getVMI(t, vmis["going"]), v1alpha1.VirtualMachineInstanceSynchronized)
		return c == nil || c.Reason != v1alpha1.BackendStorageReason, fmt.Sprintf("%+v", c)
	})
}

func getClaim(t *testing.T, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pvc); err != nil {
		t.Fatalf("the backend-storage claim %s: %v", name, err)
	}
	return pvc
}

// checkStateClaim checks the spec of a backend-storage claim the controller made.
func checkStateClaim(t *testing.T, pvc *corev1.PersistentVolumeClaim, access corev1.PersistentVolumeAccessMode, class string) {
	t.Helper()
	s := pvc.Spec
	if len(s.AccessModes) != 1 || s.AccessModes[0] != access || ptr.Deref(s.VolumeMode, "") != corev1.PersistentVolumeFilesystem ||
		!s.Resources.Requests.Storage().Equal(resource.MustParse("10Mi")) || ptr.Deref(s.StorageClassName, "") != class {
		t.Errorf("claim %s: %+v; want %s, Filesystem, 10Mi, storage class %q", pvc.Name, s, access, class)
	}
}

// checkStateMount checks that pod mounts the claim called name writable at the state directory,
// writable for the launcher's group.
func checkStateMount(t *testing.T, pod corev1.Pod, name string) {
	t.Helper()
	var mounted bool
	for _, vol := range pod.Spec.Volumes {
		if c := vol.PersistentVolumeClaim; c != nil && c.ClaimName == name && !c.ReadOnly {
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				mounted = mounted || (m.Name == vol.Name && m.MountPath == podlayout.StateDir && !m.ReadOnly)
			}
		}
	}
	if !mounted {
		t.Errorf("pod %s does not mount %s writable at %s: volumes %+v", pod.Name, name, podlayout.StateDir, pod.Spec.Volumes)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || ptr.Deref(sc.FSGroup, 0) != podlayout.LauncherUID {
		t.Errorf("pod %s has security context %+v; want fsGroup %d so the launcher can write its state", pod.Name, sc, podlayout.LauncherUID)
	}
}
