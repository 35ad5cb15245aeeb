package launcher

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// Config volumes (KubeVirt's secret, configMap, serviceAccount and downwardAPI volumes). The
// launcher pod mounts the Kubernetes volume read-only (podlayout.ConfigVolumeMount) and the launcher
// writes its files into an ISO 9660 image with WriteISO when the VM starts, as KubeVirt's
// virt-launcher does with xorrisofs -follow-links -graft-points over the volume's directory.
//
// The files are the tenant's (a Secret's keys, a ConfigMap's, annotations the tenant wrote) and the
// launcher pod is the tenant's too, so the directory is read through an os.Root: a link that leads
// out of the volume is refused, and what is read is bounded in count, depth, name length and bytes,
// with errors naming the file.

// Bounds on a config volume's files. A Secret or ConfigMap holds at most 1 MiB (an object in
// etcd), a pod's annotations 256 KiB; 2 MiB leaves room for binary data and what the kubelet adds.
const (
	maxConfigBytes   = 2 << 20
	maxConfigEntries = 1024
	maxConfigDepth   = 8
	// maxConfigName is the longest file name, in bytes. Linux takes 255 in Rock Ridge, but the
	// ISO 9660 writer puts a name's NM entry in its directory record, which holds 255 bytes in
	// all, without a continuation area: from 136 bytes on it writes a broken record.
	maxConfigName = 128
)

// ConfigFiles are the files of a config volume's directory by their slash-separated path in it, as
// its image holds them. The kubelet's own entries (names starting with "..", its atomic writer's
// timestamped directory and the ..data link; no Secret or ConfigMap key can start so) are left
// out, and links are followed within dir only.
func ConfigFiles(dir string) (map[string][]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open the volume's directory: %w", err)
	}
	defer root.Close()
	w := configWalk{root: root, files: map[string][]byte{}}
	if err := w.dir(".", 0); err != nil {
		return nil, err
	}
	return w.files, nil
}

type configWalk struct {
	root    *os.Root
	files   map[string][]byte
	entries int
	bytes   int64
}

func (w *configWalk) dir(name string, depth int) error {
	if depth > maxConfigDepth {
		return fmt.Errorf("%s: directories nest deeper than %d levels", name, maxConfigDepth)
	}
	f, err := w.root.Open(name)
	if err != nil {
		return err
	}
	entries, err := f.ReadDir(maxConfigEntries + 1)
	_ = f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s: %w", name, err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") {
			continue
		}
		if w.entries++; w.entries > maxConfigEntries {
			return fmt.Errorf("the volume holds more than %d files and directories", maxConfigEntries)
		}
		if len(e.Name()) > maxConfigName {
			return fmt.Errorf("%q...: the file name is longer than %d bytes, the most a config disk's image records", e.Name()[:32], maxConfigName)
		}
		rel := path.Join(name, e.Name())
		// Stat follows links, within the root only: a link out of the volume is an error.
		st, err := w.root.Stat(rel)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		switch {
		case st.IsDir() && strings.HasPrefix(e.Name(), "."):
			// go-diskfs derives a directory's ISO 9660 identifier from the name before its first
			// dot: ".config" would get an empty one, which ECMA-119 does not allow and readers
			// without Rock Ridge cannot open. Refuse it rather than write a broken image.
			return fmt.Errorf("%s: a directory whose name starts with a dot cannot be put in the config disk's ISO 9660 image; rename it (a file may start with a dot)", rel)
		case st.IsDir():
			if err := w.dir(rel, depth+1); err != nil {
				return err
			}
		case st.Mode().IsRegular():
			if err := w.file(rel, st.Size()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is a %s, not a regular file or directory", rel, fileKind(st.Mode()))
		}
	}
	return nil
}

func (w *configWalk) file(rel string, size int64) error {
	left := maxConfigBytes - w.bytes
	if size > left {
		return fmt.Errorf("%s: the volume's files add up to more than %d bytes", rel, maxConfigBytes)
	}
	f, err := w.root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, left+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", rel, err)
	}
	if int64(len(data)) > left {
		return fmt.Errorf("%s: the volume's files add up to more than %d bytes", rel, maxConfigBytes)
	}
	w.bytes += int64(len(data))
	w.files[rel] = data
	return nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeDevice != 0:
		return "device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// checkVolumeLabel is the API's rule for a config volume's label (v1alpha1.ValidateVolumeLabel),
// checked again here: the launcher writes it into the image's volume descriptor.
func checkVolumeLabel(p machine.Path, label string) *machine.FieldError {
	if label == "" || len(label) > 32 {
		return machine.Invalid(p, label, "must be 1 to 32 characters (an ISO 9660 volume identifier)")
	}
	for _, r := range label {
		if r < 0x20 || r > 0x7e {
			return machine.Invalid(p, label, "must be printable ASCII (an ISO 9660 volume identifier)")
		}
	}
	return nil
}

// configImageFile is the file name of a config volume's image in the scratch directory.
func configImageFile(volume string) string { return "config-" + volume + ".iso" }

// configDisk writes d's config volume image into scratch and returns it.
func (h HostResolver) configDisk(d *machine.Disk, scratch string, p machine.Path) (DiskImage, *machine.FieldError) {
	if err := checkName(p.Child("name"), d.Name); err != nil {
		return DiskImage{}, err
	}
	c, sp := d.Source.Config, p.Child("source", "config")
	if err := checkVolumeLabel(sp.Child("label"), c.Label); err != nil {
		return DiskImage{}, err
	}
	if h.ConfigVolumes == "" {
		return DiskImage{}, machine.Invalid(sp, c.Kind, "a "+c.Kind+" volume needs a launcher pod, which mounts it: this launcher has no config volumes")
	}
	files, err := ConfigFiles(filepath.Join(h.ConfigVolumes, d.Name))
	if err != nil {
		return DiskImage{}, machine.Invalid(sp, c.Kind, fmt.Sprintf("the %s volume's files: %v", c.Kind, err))
	}
	img := filepath.Join(scratch, configImageFile(d.Name))
	if err := WriteISO(img, c.Label, files, scratch); err != nil {
		return DiskImage{}, machine.Invalid(sp, c.Kind, err.Error())
	}
	// As a cloud-init image: read-only but behind a sata hard disk, which QEMU cannot attach
	// read-only; there the guest writes to the launcher's own copy, written afresh at every start.
	ro := d.CDROM || d.Bus != machine.BusSATA
	return DiskImage{Path: img, Format: "raw", ReadOnly: ro}, nil
}
