// Package storage is local mode's storage: a dynamic provisioner (built on
// sigs.k8s.io/sig-storage-lib-external-provisioner) that answers claims of its StorageClass,
// marked the cluster's default, with volumes kept on the host under the local cluster's state
// directory. A filesystem-mode volume is a directory; a block-mode volume is a sparse file of the
// claim's size, which the virtual nodes attach as a loop device (local/provider). The volumes are
// hostPath PersistentVolumes: every virtual node runs on this one host and reaches every volume,
// so a volume binds at once (no node affinity), and any access mode can be honoured.
package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

const (
	// ProvisionerName is the provisioner of ClassName.
	ProvisionerName = "qvirt.io/local-hostpath"
	// ClassName is local mode's StorageClass, the cluster's default.
	ClassName = "qvirt-local"
	// BlockFile is the file of a block-mode volume in its directory.
	BlockFile = "block.img"
	// defaultClassAnnotation marks the default StorageClass.
	defaultClassAnnotation = "storageclass.kubernetes.io/is-default-class"
)

// Provisioner keeps volumes under Dir, one directory per PersistentVolume.
type Provisioner struct {
	Dir string
}

var _ controller.BlockProvisioner = (*Provisioner)(nil)

// SupportsBlock implements controller.BlockProvisioner: block-mode claims get a file the virtual
// nodes attach as a loop device.
func (p *Provisioner) SupportsBlock(context.Context) bool { return true }

// ErrUnsupported is a claim this provisioner cannot answer; the library records it on the claim
// as a ProvisioningFailed Event.
var ErrUnsupported = errors.New("not supported by qvirt's local provisioner")

// Provision creates the volume of a claim: a directory, or for volumeMode Block a sparse file of
// the claim's requested size.
func (p *Provisioner) Provision(_ context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	pvc := opts.PVC
	if pvc.Spec.Selector != nil {
		return nil, controller.ProvisioningFinished, fmt.Errorf("claim %s/%s: spec.selector is %w", pvc.Namespace, pvc.Name, ErrUnsupported)
	}
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || size.Sign() <= 0 {
		return nil, controller.ProvisioningFinished, fmt.Errorf("claim %s/%s: spec.resources.requests.storage: a positive size is required", pvc.Namespace, pvc.Name)
	}
	dir, err := p.volumeDir(opts.PVName)
	if err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, controller.ProvisioningInBackground, fmt.Errorf("volume directory: %w", err)
	}
	mode := corev1.PersistentVolumeFilesystem
	path := dir
	if m := pvc.Spec.VolumeMode; m != nil && *m == corev1.PersistentVolumeBlock {
		mode, path = corev1.PersistentVolumeBlock, filepath.Join(dir, BlockFile)
		if err := sparseFile(path, size.Value()); err != nil {
			return nil, controller.ProvisioningInBackground, fmt.Errorf("block volume file: %w", err)
		}
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if opts.StorageClass != nil && opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			VolumeMode:                    &mode,
			PersistentVolumeReclaimPolicy: reclaim,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
		},
	}
	return pv, controller.ProvisioningFinished, nil
}

// Delete removes a volume's directory; a volume not under Dir is not this provisioner's to touch.
func (p *Provisioner) Delete(_ context.Context, pv *corev1.PersistentVolume) error {
	dir, err := p.volumeDir(pv.Name)
	if err != nil {
		return err
	}
	hp := pv.Spec.HostPath
	if hp == nil || (hp.Path != dir && hp.Path != filepath.Join(dir, BlockFile)) {
		return &controller.IgnoredError{Reason: fmt.Sprintf("volume %s is not under %s", pv.Name, p.Dir)}
	}
	return os.RemoveAll(dir)
}

// volumeDir is the directory of volume name; a name that is not a single path element (the
// library names volumes pvc-<uid>) is refused.
func (p *Provisioner) volumeDir(name string) (string, error) {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 || strings.ContainsAny(name, "/") {
		return "", fmt.Errorf("volume name %q: %s", name, strings.Join(errs, "; "))
	}
	return filepath.Join(p.Dir, name), nil
}

// sparseFile creates a sparse file of size bytes, or leaves one of that size (a retried call).
func sparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		if fi, err := os.Stat(path); err == nil && fi.Size() == size {
			return nil
		}
		return fmt.Errorf("%s exists with another size", path)
	}
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// StorageClass is local mode's default StorageClass: volumes bind at once, are deleted with their
// claims, and may grow.
func StorageClass() *storagev1.StorageClass {
	immediate := storagev1.VolumeBindingImmediate
	reclaim := corev1.PersistentVolumeReclaimDelete
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: ClassName, Annotations: map[string]string{defaultClassAnnotation: "true"}},
		Provisioner:       ProvisionerName,
		ReclaimPolicy:     &reclaim,
		VolumeBindingMode: &immediate,
	}
}

// Install creates the StorageClass (kept when it exists) and the volumes directory.
func Install(ctx context.Context, client kubernetes.Interface, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("volumes directory: %w", err)
	}
	_, err := client.StorageV1().StorageClasses().Create(ctx, StorageClass(), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create StorageClass %s: %w", ClassName, err)
	}
	return nil
}

// Run provisions the claims of the StorageClass with volumes under dir until ctx ends; the library
// logs to ctx's logger (klog.NewContext).
func Run(ctx context.Context, client kubernetes.Interface, dir string) error {
	pc := controller.NewProvisionController(ctx, client, ProvisionerName, &Provisioner{Dir: dir},
		controller.LeaderElection(false), controller.Threadiness(2))
	pc.Run(ctx)
	return nil
}
