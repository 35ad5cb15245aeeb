package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

func claim(mode corev1.PersistentVolumeMode, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
}

// TestProvisionAndDelete: a filesystem claim gets a directory, a block claim a sparse file of its
// size, each a hostPath volume matching the claim; Delete removes them, and nothing outside the
// provisioner's directory.
func TestProvisionAndDelete(t *testing.T) {
	dir := t.TempDir()
	p := &Provisioner{Dir: dir}
	ctx := context.Background()
	fs, state, err := p.Provision(ctx, controller.ProvisionOptions{PVName: "pvc-1", PVC: claim(corev1.PersistentVolumeFilesystem, "1Gi"), StorageClass: StorageClass()})
	if err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("filesystem claim: %v (%s)", err, state)
	}
	if fs.Spec.HostPath == nil || fs.Spec.HostPath.Path != filepath.Join(dir, "pvc-1") || *fs.Spec.VolumeMode != corev1.PersistentVolumeFilesystem ||
		fs.Spec.Capacity.Storage().String() != "1Gi" || fs.Spec.AccessModes[0] != corev1.ReadWriteMany ||
		fs.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("filesystem volume %+v", fs.Spec)
	}
	if fi, err := os.Stat(fs.Spec.HostPath.Path); err != nil || !fi.IsDir() {
		t.Errorf("no directory at %s: %v", fs.Spec.HostPath.Path, err)
	}
	blk, _, err := p.Provision(ctx, controller.ProvisionOptions{PVName: "pvc-2", PVC: claim(corev1.PersistentVolumeBlock, "16Mi")})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(blk.Spec.HostPath.Path); err != nil || fi.Size() != 16<<20 || *blk.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Errorf("block volume %+v: file %v, %v", blk.Spec, fi, err)
	}
	// A retried call for the same volume is the same volume.
	if _, _, err := p.Provision(ctx, controller.ProvisionOptions{PVName: "pvc-2", PVC: claim(corev1.PersistentVolumeBlock, "16Mi")}); err != nil {
		t.Errorf("retried block provision: %v", err)
	}

	outside := t.TempDir()
	foreign := fs.DeepCopy()
	foreign.Name = "pvc-3"
	foreign.Spec.HostPath.Path = outside
	var ignored *controller.IgnoredError
	if err := p.Delete(ctx, foreign); !errors.As(err, &ignored) {
		t.Errorf("deleting a volume not under the provisioner's directory: %v, want IgnoredError", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the foreign volume's directory was removed")
	}
	for _, pv := range []*corev1.PersistentVolume{fs, blk} {
		if err := p.Delete(ctx, pv); err != nil {
			t.Fatal(err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left after delete: %v", entries)
	}
}

func TestProvisionRefusals(t *testing.T) {
	p := &Provisioner{Dir: t.TempDir()}
	withSelector := claim(corev1.PersistentVolumeFilesystem, "1Gi")
	withSelector.Spec.Selector = &metav1.LabelSelector{}
	for name, tc := range map[string]struct {
		opts controller.ProvisionOptions
		want string
	}{
		"a selector":  {controller.ProvisionOptions{PVName: "pvc-1", PVC: withSelector}, "spec.selector is not supported"},
		"no size":     {controller.ProvisionOptions{PVName: "pvc-1", PVC: claim(corev1.PersistentVolumeFilesystem, "0")}, "spec.resources.requests.storage"},
		"a path name": {controller.ProvisionOptions{PVName: "../etc", PVC: claim(corev1.PersistentVolumeFilesystem, "1Gi")}, `volume name "../etc"`},
	} {
		_, state, err := p.Provision(context.Background(), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) || state != controller.ProvisioningFinished {
			t.Errorf("%s: %v (%s), want a final error with %q", name, err, state, tc.want)
		}
	}
}
