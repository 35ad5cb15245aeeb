package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// withConfigVolumes gives v one volume of each config kind, each on a disk, as a KubeVirt manifest
// writes them.
func withConfigVolumes(v *v1alpha1.VirtualMachineInstance) {
	vols := []v1alpha1.Volume{
		{Name: "app-secret", VolumeSource: v1alpha1.VolumeSource{Secret: &v1alpha1.SecretVolumeSource{SecretName: "app", VolumeLabel: "APPSECRET"}}},
		{Name: "app-config", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "app-cm"}, Optional: ptr.To(true)}}},
		{Name: "sa", VolumeSource: v1alpha1.VolumeSource{ServiceAccount: &v1alpha1.ServiceAccountVolumeSource{ServiceAccountName: "vm-sa"}}},
		{Name: "podinfo", VolumeSource: v1alpha1.VolumeSource{DownwardAPI: &v1alpha1.DownwardAPIVolumeSource{Fields: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
	}
	for _, vol := range vols {
		v.Spec.Volumes = append(v.Spec.Volumes, vol)
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: vol.Name, CDRom: &v1alpha1.CDRomTarget{}})
	}
}

// configMounts are the compute container's mounts under podlayout.ConfigVolumeDir, by mount path:
// the pod volume's source and whether the mount is read-only.
func configMounts(t *testing.T, pod *corev1.Pod) map[string]string {
	t.Helper()
	vols := map[string]corev1.VolumeSource{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v.VolumeSource
	}
	out := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		src, ok := vols[m.Name]
		if !ok || len(m.MountPath) <= len(podlayout.ConfigVolumeDir) || m.MountPath[:len(podlayout.ConfigVolumeDir)] != podlayout.ConfigVolumeDir {
			continue
		}
		var desc string
		switch {
		case src.Secret != nil:
			desc = fmt.Sprintf("secret %s optional=%v", src.Secret.SecretName, ptr.Deref(src.Secret.Optional, false))
		case src.ConfigMap != nil:
			desc = fmt.Sprintf("configMap %s optional=%v", src.ConfigMap.Name, ptr.Deref(src.ConfigMap.Optional, false))
		case src.DownwardAPI != nil:
			for _, it := range src.DownwardAPI.Items {
				desc += fmt.Sprintf("downwardAPI %s=%s ", it.Path, it.FieldRef.FieldPath)
			}
		case src.Projected != nil:
			for _, p := range src.Projected.Sources {
				switch {
				case p.ServiceAccountToken != nil:
					desc += fmt.Sprintf("token %s exp=%d ", p.ServiceAccountToken.Path, ptr.Deref(p.ServiceAccountToken.ExpirationSeconds, 0))
				case p.ConfigMap != nil:
					desc += fmt.Sprintf("configMap %s:%s ", p.ConfigMap.Name, p.ConfigMap.Items[0].Path)
				case p.DownwardAPI != nil:
					desc += fmt.Sprintf("downwardAPI %s=%s ", p.DownwardAPI.Items[0].Path, p.DownwardAPI.Items[0].FieldRef.FieldPath)
				}
			}
		}
		out[m.MountPath] = fmt.Sprintf("%s ro=%v", desc, m.ReadOnly)
	}
	return out
}

// TestConfigVolumePod (real API server): the launcher pod of an instance with a secret, a
// configMap, a serviceAccount and a downwardAPI volume holds the Kubernetes volume behind each,
// read-only where the launcher reads it; it runs as the volume's service account, whose token,
// CA certificate and namespace are projected as a pod's automounted ones are, and it still
// automounts nothing. While the (not optional) Secret is missing, the instance says so.
func TestConfigVolumePod(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "vm-sa", Namespace: ns}}
	if err := cp.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	v := newVMI(ns, "cfg")
	withConfigVolumes(v)
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, v)
	want := map[string]string{
		"/var/run/qvirt/config-volumes/app-secret": "secret app optional=false ro=true",
		"/var/run/qvirt/config-volumes/app-config": "configMap app-cm optional=true ro=true",
		"/var/run/qvirt/config-volumes/sa":         "token token exp=3607 configMap kube-root-ca.crt:ca.crt downwardAPI namespace=metadata.namespace  ro=true",
		"/var/run/qvirt/config-volumes/podinfo":    "downwardAPI labels=metadata.labels  ro=true",
	}
	if got := configMounts(t, &pod); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("config volume mounts\n got %v\nwant %v", got, want)
	}
	if pod.Spec.ServiceAccountName != "vm-sa" {
		t.Errorf("pod runs as service account %q, want vm-sa", pod.Spec.ServiceAccountName)
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false", a)
	}
	if podlayout.ConfigVolumeMount("sa") != "/var/run/qvirt/config-volumes/sa" {
		t.Error("the launcher looks elsewhere than the pod mounts")
	}

	// The Secret does not exist: the instance says which volume waits for it (the optional
	// ConfigMap, missing too, is no reason to wait), and stops saying so once it exists.
	const msg = `spec.volumes[0].secret.secretName: Secret "app" not found`
	eventually(t, "Synchronized=False SecretNotFound naming the secret volume", func() (bool, string) {
		got := getVMI(t, v)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		if c == nil {
			return false, fmt.Sprintf("phase %s, no Synchronized condition", got.Status.Phase)
		}
		return c.Status == metav1.ConditionFalse && c.Reason == ReasonSecretNotFound && strings.Contains(c.Message, msg) && !strings.Contains(c.Message, "app-cm"), fmt.Sprintf("%+v", c)
	})
	if err := cp.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns}, StringData: map[string]string{"username": "admin"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the condition gone once the Secret exists", func() (bool, string) {
		c := meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		return c == nil, fmt.Sprintf("%+v", c)
	})
}
