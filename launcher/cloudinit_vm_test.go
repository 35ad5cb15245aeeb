package launcher_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestCloudInitInTheGuest boots the test guest with a cloudInitNoCloud volume on a sata cdrom (its
// user data from a Secret, as a launcher pod mounts it) and a cloudInitConfigDrive volume on a
// virtio disk, both described by the node agent's translation, and reads them in the guest the way
// cloud-init finds them: by volume label, mounted as iso9660, under their names. The same boot
// carries config volumes (KubeVirt's secret and configMap volumes): a secret with a volumeLabel
// on a virtio disk and a configMap on a sata cdrom, their files laid out as the kubelet writes
// them; the guest mounts each as iso9660 and reads the files under their keys.
func TestCloudInitInTheGuest(t *testing.T) {
	t.Parallel()
	const userData = "#cloud-config\n# QVIRT-NOCLOUD-USERDATA-FROM-SECRET\n"
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, "cidata", "userdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "cidata", "userdata", "userdata"), []byte(userData), 0o644); err != nil {
		t.Fatal(err)
	}

	vmi := guestVMI(t)
	vmi.UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
	vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: "cidata", CDRom: &v1alpha1.CDRomTarget{}})
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: "cidata", VolumeSource: v1alpha1.VolumeSource{
		CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "ud"}, NetworkData: "version: 2\n"}}})
	req := testutil.SyncRequest(t, vmi, nil)

	// An instance has one cloud-init volume; the ConfigDrive disk is another instance's, translated
	// the same way, added to this machine so one boot shows both.
	other := guestVMI(t)
	other.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "config", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	other.Spec.Volumes = []v1alpha1.Volume{{Name: "config", VolumeSource: v1alpha1.VolumeSource{
		CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{UserDataBase64: "I2Nsb3VkLWNvbmZpZwojIFFWSVJULUNPTkZJRy1EUklWRS1VU0VSREFUQQo="}}}}
	req.Machine.Disks = append(req.Machine.Disks, testutil.SyncRequest(t, other, nil).Machine.Disks[0])

	// Config volumes, after the ConfigDrive disk so the virtio disks keep their names.
	configVols := t.TempDir()
	for name, files := range map[string]map[string]string{
		"app-secret": {"username": "admin", "password": "QVIRT-SECRET-PASSWORD", ".hidden-key": "dot", "sub/nested": "QVIRT-NESTED"},
		"app-config": {"greeting": "QVIRT-CONFIGMAP-GREETING"},
	} {
		if err := os.Mkdir(filepath.Join(configVols, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeAtomic(t, filepath.Join(configVols, name), files)
	}
	cfg := guestVMI(t)
	cfg.Spec.Domain.Devices.Disks = []v1alpha1.Disk{
		{Name: "app-secret", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}},
		{Name: "app-config", CDRom: &v1alpha1.CDRomTarget{}}}
	cfg.Spec.Volumes = []v1alpha1.Volume{
		{Name: "app-secret", VolumeSource: v1alpha1.VolumeSource{Secret: &v1alpha1.SecretVolumeSource{SecretName: "app", VolumeLabel: "APPSECRET"}}},
		{Name: "app-config", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}}}
	req.Machine.Disks = append(req.Machine.Disks, testutil.SyncRequest(t, cfg, nil).Machine.Disks...)

	v := newLauncherWith(t, launcher.HostResolver{SpareRootPorts: 2, CloudInitSecrets: secrets, ConfigVolumes: configVols})
	st, err := v.client.Sync(context.Background(), req)
	if err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	// The scratch disk is /dev/vda, the ConfigDrive disk /dev/vdb, the NoCloud cdrom /dev/sr0.
	// The volume label, at byte 40 of the primary volume descriptor in sector 16 (the guest's
	// busybox has no blkid, and its findfs does not probe iso9660).
	label := func(dev string) string {
		return "echo LABEL=$(dd if=" + dev + " bs=1 skip=32808 count=32 2>/dev/null)"
	}
	c.Run(t, label("/dev/sr0"), "LABEL=cidata\r", time.Minute)
	c.Run(t, label("/dev/vdb"), "LABEL=config-2\r", time.Minute)
	c.Run(t, "mkdir -p /mnt/nc /mnt/cd && mount -t iso9660 -o ro /dev/sr0 /mnt/nc && ls -1 /mnt/nc | tr '\\n' ,", "meta-data,network-config,user-data,", time.Minute)
	c.Run(t, "cat /mnt/nc/user-data", "# QVIRT-NOCLOUD-USERDATA-FROM-SECRET", time.Minute)
	c.Run(t, "cat /mnt/nc/meta-data; echo", `{"instance-id":"0f8fad5b-d9cb-469f-a165-70867728950e","local-hostname":"testguest"}`, time.Minute)
	// Linux reads Rock Ridge names first; the Joliet tree has the same names.
	c.Run(t, "mkdir -p /mnt/joliet && mount -t iso9660 -o ro,norock /dev/sr0 /mnt/joliet && ls -1 /mnt/joliet | tr '\\n' ,", "meta-data,network-config,user-data,", time.Minute)
	c.Run(t, "mount -t iso9660 -o ro /dev/vdb /mnt/cd && ls -1 /mnt/cd/openstack/latest | tr '\\n' ,", "meta_data.json,user_data,", time.Minute)
	c.Run(t, "cat /mnt/cd/openstack/latest/user_data", "# QVIRT-CONFIG-DRIVE-USERDATA", time.Minute)
	c.Run(t, "cat /mnt/cd/openstack/latest/meta_data.json; echo", `"instance_id":"testguest.`, time.Minute)
	c.Run(t, "echo VDB-RO-$(cat /sys/block/vdb/ro)", "VDB-RO-1", time.Minute)

	// The secret volume is /dev/vdc, labelled as its volumeLabel says; the configMap volume is the
	// second cdrom, /dev/sr1, labelled cfgdata (KubeVirt's default).
	c.Run(t, label("/dev/vdc"), "LABEL=APPSECRET\r", time.Minute)
	c.Run(t, label("/dev/sr1"), "LABEL=cfgdata\r", time.Minute)
	c.Run(t, "mkdir -p /mnt/sec /mnt/cm && mount -t iso9660 -o ro /dev/vdc /mnt/sec && ls -1A /mnt/sec | tr '\\n' ,", ".hidden-key,password,sub,username,", time.Minute)
	c.Run(t, "echo $(cat /mnt/sec/password)-$(cat /mnt/sec/sub/nested)-$(cat /mnt/sec/.hidden-key)", "QVIRT-SECRET-PASSWORD-QVIRT-NESTED-dot", time.Minute)
	c.Run(t, "echo VDC-RO-$(cat /sys/block/vdc/ro)", "VDC-RO-1", time.Minute)
	c.Run(t, "mount -t iso9660 -o ro /dev/sr1 /mnt/cm && ls -1A /mnt/cm | tr '\\n' , && cat /mnt/cm/greeting", "greeting,QVIRT-CONFIGMAP-GREETING", time.Minute)
}
