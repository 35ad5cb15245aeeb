package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
)

// The cloud-init image. The launcher writes it at start into its scratch directory (the pod's
// private emptyDir) with github.com/diskfs/go-diskfs, a maintained pure-Go ISO 9660 writer with Rock
// Ridge and Joliet: without one of them Linux shows names as ISO 9660 d-characters (USER_DAT.;1,
// lowercased to user_dat. at best), and cloud-init looks for user-data and meta-data exactly. The
// layouts and the meta-data are KubeVirt's (pkg/cloud-init), which wrote them with xorrisofs
// -joliet -rock; nothing here runs a program.

// Volume labels the guest's cloud-init looks for.
const (
	NoCloudLabel     = "cidata"
	ConfigDriveLabel = "config-2"
)

// maxSecretData bounds what the launcher reads from a Secret volume's key: a Secret holds at most
// 1 MiB.
const maxSecretData = 1 << 20

// noCloudMetaData and configDriveMetaData are the meta-data files, as KubeVirt writes them (JSON,
// which NoCloud reads as YAML).
type noCloudMetaData struct {
	InstanceID    string `json:"instance-id"`
	LocalHostname string `json:"local-hostname,omitempty"`
}

type configDriveMetaData struct {
	InstanceID string `json:"instance_id"`
	Hostname   string `json:"hostname,omitempty"`
	UUID       string `json:"uuid,omitempty"`
}

// CloudInitFiles are the files of ci's image by their path in it, and its volume label. Data from a
// Secret is read from secretDir (podlayout.CloudInitSecretDir in a pod) under the disk's volume
// name; errors are at p.
func CloudInitFiles(ci *machine.CloudInit, disk, secretDir string, p machine.Path) (files map[string][]byte, label string, ferr *machine.FieldError) {
	user, err := cloudInitData(ci.UserData, secretDir, disk, podlayout.CloudInitUserData, "userData")
	if err != nil {
		return nil, "", machine.Invalid(p.Child("userData"), "<from a Secret>", err.Error())
	}
	network, err := cloudInitData(ci.NetworkData, secretDir, disk, podlayout.CloudInitNetworkData, "networkData")
	if err != nil {
		return nil, "", machine.Invalid(p.Child("networkData"), "<from a Secret>", err.Error())
	}
	if ci.InstanceID == "" {
		return nil, "", machine.Required(p.Child("instanceID"), "cloud-init needs an instance-id")
	}
	var dir, metaFile, userFile, networkFile string
	var meta any
	switch ci.DataSource {
	case machine.CloudInitNoCloud:
		label, metaFile, userFile, networkFile = NoCloudLabel, "meta-data", "user-data", "network-config"
		meta = noCloudMetaData{InstanceID: ci.InstanceID, LocalHostname: ci.Hostname}
	case machine.CloudInitConfigDrive:
		label, dir, metaFile, userFile, networkFile = ConfigDriveLabel, "openstack/latest", "meta_data.json", "user_data", "network_data.json"
		meta = configDriveMetaData{InstanceID: ci.InstanceID, Hostname: ci.Hostname, UUID: ci.UUID}
	default:
		return nil, "", machine.NotSupported(p.Child("dataSource"), ci.DataSource, []string{string(machine.CloudInitNoCloud), string(machine.CloudInitConfigDrive)})
	}
	metaData, err := json.Marshal(meta)
	if err != nil {
		return nil, "", machine.Invalid(p, ci.InstanceID, err.Error())
	}
	// As KubeVirt: user data is always there (empty when only network data is given), network
	// data only when given.
	files = map[string][]byte{path.Join(dir, metaFile): metaData, path.Join(dir, userFile): user}
	if len(network) > 0 {
		files[path.Join(dir, networkFile)] = network
	}
	return files, label, nil
}

// cloudInitData is d's bytes: inline, or the first of key and alt in the disk's Secret volume for
// this kind of data.
func cloudInitData(d machine.CloudInitData, secretDir, disk, kind, alt string) ([]byte, error) {
	if !d.FromSecret {
		return []byte(d.Inline), nil
	}
	if secretDir == "" {
		return nil, errors.New("data from a Secret needs a launcher pod, which mounts it: this launcher has no Secret volumes")
	}
	dir := filepath.Join(secretDir, filepath.Base(filepath.Clean("/"+disk)), kind)
	var firstErr error
	for _, key := range []string{kind, alt} {
		data, err := readBounded(filepath.Join(dir, key), maxSecretData)
		if err == nil {
			return data, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if errors.Is(firstErr, os.ErrNotExist) {
		return nil, fmt.Errorf("the Secret has neither a %s nor a %s key", kind, alt)
	}
	return nil, fmt.Errorf("read the Secret's %s key: %w", kind, firstErr)
}

func readBounded(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", filepath.Base(name), limit)
	}
	return data, nil
}

// cloudInitImageFile is the file name of a cloud-init volume's image in the scratch directory.
func cloudInitImageFile(volume string) string { return "cloudinit-" + volume + ".iso" }

// WriteISO writes files (by slash-separated path) into a new ISO 9660 image at out with Rock Ridge
// and Joliet names and the volume label label. It replaces out atomically, so a reader never sees
// half an image; workDir holds the staged files meanwhile.
func WriteISO(out, label string, files map[string][]byte, workDir string) (err error) {
	stage, err := os.MkdirTemp(workDir, ".iso-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage) // Finalize removes it on success; this covers the failures
	tmp := out + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	fsys, err := iso9660.Create(file.New(f, false), 0, 0, 2048, stage)
	if err != nil {
		return fmt.Errorf("create ISO 9660 image: %w", err)
	}
	for name, data := range files {
		if err := addISOFile(fsys, "/"+name, data); err != nil {
			return fmt.Errorf("add %s to the ISO 9660 image: %w", name, err)
		}
	}
	// ECMA-119 pads the volume identifier with spaces, which the library leaves to its caller (it
	// pads with NULs); Joliet's copy takes the first 16 characters, space-padded in UCS-2 as well.
	padded := fmt.Sprintf("%-32s", label)
	if err := fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: padded}); err != nil {
		return fmt.Errorf("write ISO 9660 image: %w", err)
	}
	// No fsync: the image lives as long as this launcher, which writes it afresh at every start.
	return os.Rename(tmp, out)
}

func addISOFile(fsys *iso9660.FileSystem, name string, data []byte) error {
	if dir := path.Dir(name); dir != "/" {
		if err := fsys.Mkdir(dir); err != nil {
			return err
		}
	}
	w, err := fsys.OpenFile(name, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

// cloudInitDisk writes d's cloud-init image into scratch and returns it.
func (h HostResolver) cloudInitDisk(d *machine.Disk, scratch string, p machine.Path) (DiskImage, *machine.FieldError) {
	if err := checkName(p.Child("name"), d.Name); err != nil {
		return DiskImage{}, err
	}
	sp := p.Child("source", "cloudInit")
	files, label, ferr := CloudInitFiles(d.Source.CloudInit, d.Name, h.CloudInitSecrets, sp)
	if ferr != nil {
		return DiskImage{}, ferr
	}
	img := filepath.Join(scratch, cloudInitImageFile(d.Name))
	if err := WriteISO(img, label, files, scratch); err != nil {
		return DiskImage{}, machine.Invalid(sp, d.Source.CloudInit.DataSource, err.Error())
	}
	// Read-only for the guest, except behind a sata hard disk, which QEMU cannot attach read-only:
	// there the guest writes to the launcher's own copy, written afresh at every start.
	ro := d.CDROM || d.Bus != machine.BusSATA
	return DiskImage{Path: img, Format: "raw", ReadOnly: ro}, nil
}
