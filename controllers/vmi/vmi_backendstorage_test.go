package vmi

import (
	"context"
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
// backend-storage claim (persistent-state-for-<name>: ReadWriteMany, 10Mi, filesystem, of the
// configured vmStateStorageClass), controlled by its VM, or by itself when no VM owns it; its
// launcher pod mounts the claim writable at the launcher's state directory; it is not
// live-migratable, saying why; and a claim of that name that exists already is used as it is.
func TestBackendStorage(t *testing.T) {
	ns := newNamespace(t)
	cfg := config.Default()
	cfg.UseEmulation, cfg.VMStateStorageClass = true, "vm-state"
	startManager(t, ns, config.NewStore(cfg), cp.Config)
	ctx := context.Background()

	owned := persistentVMI(ns, "owned")
	vmRef := metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachine", Name: "owned",
		UID: types.UID("4b7c9a52-0d61-4d2e-9f1e-3c5a8b2d7e10"), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	owned.OwnerReferences = []metav1.OwnerReference{vmRef}
	alone := persistentVMI(ns, "alone")
	alone.Spec.Domain.Firmware = nil // the TPM alone asks for the claim too
	for _, v := range []*v1alpha1.VirtualMachineInstance{owned, alone} {
		if err := cp.Client.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
	}

	for _, v := range []*v1alpha1.VirtualMachineInstance{owned, alone} {
		pod := waitPod(t, v)
		pvc := &corev1.PersistentVolumeClaim{}
		name := "persistent-state-for-" + v.Name
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pvc); err != nil {
			t.Fatalf("the backend-storage claim of %s: %v", v.Name, err)
		}
		s := pvc.Spec
		if len(s.AccessModes) != 1 || s.AccessModes[0] != corev1.ReadWriteMany || ptr.Deref(s.VolumeMode, "") != corev1.PersistentVolumeFilesystem ||
			!s.Resources.Requests.Storage().Equal(resource.MustParse("10Mi")) || ptr.Deref(s.StorageClassName, "") != "vm-state" {
			t.Errorf("claim %s: %+v; want ReadWriteMany, Filesystem, 10Mi, storage class vm-state", name, s)
		}
		owner := metav1.GetControllerOf(pvc)
		wantUID := getVMI(t, v).UID
		if v == owned {
			wantUID = vmRef.UID
		}
		if owner == nil || owner.UID != wantUID {
			t.Errorf("claim %s is controlled by %+v; want UID %s", name, owner, wantUID)
		}

		var mounted bool
		for _, vol := range pod.Spec.Volumes {
			if c := vol.PersistentVolumeClaim; c != nil && c.ClaimName == name && !c.ReadOnly {
				for _, m := range pod.Spec.Containers[0].VolumeMounts {
					mounted = mounted || (m.Name == vol.Name && m.MountPath == podlayout.StateDir && !m.ReadOnly)
				}
			}
		}
		if !mounted {
			t.Errorf("pod of %s does not mount %s writable at %s: volumes %+v", v.Name, name, podlayout.StateDir, pod.Spec.Volumes)
		}
		if sc := pod.Spec.SecurityContext; sc == nil || ptr.Deref(sc.FSGroup, 0) != podlayout.LauncherUID {
			t.Errorf("pod of %s has security context %+v; want fsGroup %d so the launcher can write its state", v.Name, sc, podlayout.LauncherUID)
		}
		eventually(t, "LiveMigratable=False for "+v.Name, func() (bool, string) {
			c := migratable(t, v)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PersistentStateReason, ptr.Deref(c, metav1.Condition{}).Reason
		})
	}

	// A claim of the name exists already (the VM's, from its last instance): used as it is.
	createClaim(t, ns, "persistent-state-for-again", corev1.ReadWriteMany, corev1.PersistentVolumeFilesystem)
	again := persistentVMI(ns, "again")
	if err := cp.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitPod(t, again)
	pvc := &corev1.PersistentVolumeClaim{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "persistent-state-for-again"}, pvc); err != nil {
		t.Fatal(err)
	}
	if !pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("1Gi")) || len(pvc.OwnerReferences) != 0 {
		t.Errorf("the existing claim was changed: %+v", pvc)
	}
}
