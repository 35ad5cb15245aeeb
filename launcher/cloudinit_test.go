package launcher_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// readISO opens the image at path with the ISO 9660 reader and returns its label and every file
// by path.
func readISO(t testing.TB, path string) (string, map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := iso9660.Read(file.New(f, true), st.Size(), 0, 2048)
	if err != nil {
		t.Fatalf("read %s back as ISO 9660: %v", path, err)
	}
	files := map[string]string{}
	var walk func(dir string)
	walk = func(dir string) {
		ents, err := fsys.ReadDir(dir)
		if err != nil {
			t.Fatalf("readdir %s: %v", dir, err)
		}
		for _, e := range ents {
			// go-diskfs's reader takes a backslash for a path separator: a directory named "\"
			// opens the root again, without end. Names with one are left to rockRidgeNames.
			if strings.Contains(e.Name(), `\`) {
				continue
			}
			p := e.Name()
			if dir != "." {
				p = dir + "/" + p
			}
			if e.IsDir() {
				walk(p)
				continue
			}
			data, err := fsys.ReadFile(p)
			if err != nil {
				t.Fatalf("read %s: %v", p, err)
			}
			files[p] = string(data)
		}
	}
	walk(".")
	return strings.TrimRight(fsys.Label(), " "), files
}

func names(files map[string]string) []string {
	out := make([]string, 0, len(files))
	for n := range files {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// cloudInitDisk is a cloud-init cdrom as the node agent describes it.
func cloudInitDisk(name string, ci machine.CloudInit) machine.Disk {
	return machine.Disk{Name: name, Bus: machine.BusSATA, CDROM: true, ReadOnly: true, Cache: machine.CacheNone, IO: machine.IOThreads,
		Source: machine.Source{CloudInit: &ci}}
}

// TestCloudInitNoCloudImage: the launcher writes a NoCloud volume as an ISO 9660 image labelled
// cidata with user-data, meta-data (KubeVirt's JSON: instance-id, local-hostname) and
// network-config, names as cloud-init looks for them (lowercase, with dashes), read-only.
func TestCloudInitNoCloudImage(t *testing.T) {
	scratch := t.TempDir()
	res := launcher.HostResolver{ScratchDir: scratch}
	userData := "#cloud-config\nhostname: ignored-by-this-test\n"
	d := cloudInitDisk("cidata", machine.CloudInit{DataSource: machine.CloudInitNoCloud, InstanceID: "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab",
		Hostname: "vm1", UserData: machine.CloudInitData{Inline: userData}, NetworkData: machine.CloudInitData{Inline: "version: 2\n"}})
	img, ferr := res.ResolveDisk(&d, t.TempDir(), machine.Path("machine.disks").Index(0))
	if ferr != nil {
		t.Fatal(ferr)
	}
	if img.Format != "raw" || !img.ReadOnly || filepath.Dir(img.Path) != scratch {
		t.Errorf("image %+v: want a read-only raw image in the scratch directory %s", img, scratch)
	}
	label, files := readISO(t, img.Path)
	if label != "cidata" {
		t.Errorf("volume label %q, want cidata", label)
	}
	if got := names(files); strings.Join(got, " ") != "meta-data network-config user-data" {
		t.Fatalf("files %v, want meta-data network-config user-data", got)
	}
	if files["user-data"] != userData || files["network-config"] != "version: 2\n" {
		t.Errorf("user-data %q, network-config %q", files["user-data"], files["network-config"])
	}
	var meta map[string]string
	if err := json.Unmarshal([]byte(files["meta-data"]), &meta); err != nil {
		t.Fatalf("meta-data %q: %v", files["meta-data"], err)
	}
	if len(meta) != 2 || meta["instance-id"] != "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab" || meta["local-hostname"] != "vm1" {
		t.Errorf("meta-data %v: want instance-id and local-hostname", meta)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(scratch, ".iso-*")); len(leftovers) > 0 {
		t.Errorf("staging left behind: %v", leftovers)
	}

	// A sata hard disk cannot be read-only in QEMU: the guest gets the launcher's copy writable.
	d.CDROM, d.ReadOnly = false, false
	if img, ferr := res.ResolveDisk(&d, t.TempDir(), machine.Path("machine.disks").Index(0)); ferr != nil || img.ReadOnly {
		t.Errorf("sata disk: %+v, %v; want a writable image", img, ferr)
	}
}

// TestCloudInitConfigDriveImage: a ConfigDrive volume is an image labelled config-2 with
// openstack/latest/{meta_data.json,user_data,network_data.json}; data from a Secret comes from the
// pod's Secret volume for the disk, under KubeVirt's keys (userdata, else userData), and without
// network data there is no network_data.json.
func TestCloudInitConfigDriveImage(t *testing.T) {
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, "config", "userdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "config", "userdata", "userData"), []byte("#cloud-config\nfrom: secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := launcher.HostResolver{CloudInitSecrets: secrets}
	d := cloudInitDisk("config", machine.CloudInit{DataSource: machine.CloudInitConfigDrive, InstanceID: "vm1.default",
		UUID: "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab", Hostname: "vm1", UserData: machine.CloudInitData{FromSecret: true}})
	runDir := t.TempDir()
	img, ferr := res.ResolveDisk(&d, runDir, machine.Path("machine.disks").Index(0))
	if ferr != nil {
		t.Fatal(ferr)
	}
	if filepath.Dir(img.Path) != runDir {
		t.Errorf("image at %s: without a scratch directory it goes in the run directory", img.Path)
	}
	label, files := readISO(t, img.Path)
	if label != "config-2" {
		t.Errorf("volume label %q, want config-2", label)
	}
	if got := names(files); strings.Join(got, " ") != "openstack/latest/meta_data.json openstack/latest/user_data" {
		t.Fatalf("files %v", got)
	}
	if files["openstack/latest/user_data"] != "#cloud-config\nfrom: secret\n" {
		t.Errorf("user_data %q: want the Secret's", files["openstack/latest/user_data"])
	}
	var meta map[string]string
	if err := json.Unmarshal([]byte(files["openstack/latest/meta_data.json"]), &meta); err != nil {
		t.Fatal(err)
	}
	if len(meta) != 3 || meta["instance_id"] != "vm1.default" || meta["uuid"] != "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab" || meta["hostname"] != "vm1" {
		t.Errorf("meta_data.json %v", meta)
	}
}

// TestCloudInitRefusals: what the launcher cannot write is refused naming the machine field, and
// nothing is left behind.
func TestCloudInitRefusals(t *testing.T) {
	secrets := t.TempDir()
	if err := os.MkdirAll(filepath.Join(secrets, "cidata", "networkdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secrets, "cidata", "networkdata", "networkdata"), bytes.Repeat([]byte("x"), 1<<20+1), 0o644); err != nil {
		t.Fatal(err)
	}
	ok := machine.CloudInit{DataSource: machine.CloudInitNoCloud, InstanceID: "i-1", UserData: machine.CloudInitData{Inline: "#cloud-config"}}
	cases := []struct {
		name    string
		secrets string
		mutate  func(ci *machine.CloudInit)
		field   string
		msg     string
	}{
		{"user data from a Secret outside a pod", "", func(ci *machine.CloudInit) { ci.UserData = machine.CloudInitData{FromSecret: true} },
			"machine.disks[0].source.cloudInit.userData", "needs a launcher pod"},
		{"a Secret without the key", secrets, func(ci *machine.CloudInit) { ci.UserData = machine.CloudInitData{FromSecret: true} },
			"machine.disks[0].source.cloudInit.userData", "neither a userdata nor a userData key"},
		{"network data over a Secret's size", secrets, func(ci *machine.CloudInit) { ci.NetworkData = machine.CloudInitData{FromSecret: true} },
			"machine.disks[0].source.cloudInit.networkData", "larger than 1048576 bytes"},
		{"no instance-id", secrets, func(ci *machine.CloudInit) { ci.InstanceID = "" }, "machine.disks[0].source.cloudInit.instanceID", "instance-id"},
		{"unknown data source", secrets, func(ci *machine.CloudInit) { ci.DataSource = "ec2" }, "machine.disks[0].source.cloudInit.dataSource", "noCloud"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ci := ok
			tc.mutate(&ci)
			d := cloudInitDisk("cidata", ci)
			scratch := t.TempDir()
			_, ferr := launcher.HostResolver{ScratchDir: scratch, CloudInitSecrets: tc.secrets}.ResolveDisk(&d, scratch, machine.Path("machine.disks").Index(0))
			var fe *machine.FieldError
			if !errors.As(error(ferr), &fe) || fe.Field != tc.field || !strings.Contains(fe.Error(), tc.msg) {
				t.Fatalf("want an error at %s saying %q, got %v", tc.field, tc.msg, ferr)
			}
			if ents, _ := os.ReadDir(scratch); len(ents) > 0 {
				t.Errorf("left behind in the scratch directory: %v", ents)
			}
		})
	}
}

// FuzzWriteISO: whatever bytes a user puts in user and network data come back byte for byte from
// the image the guest reads.
func FuzzWriteISO(f *testing.F) {
	f.Add([]byte("#cloud-config\n"), []byte("version: 2\n"))
	f.Add([]byte{}, []byte{0, 0xff, '\n'})
	f.Add(bytes.Repeat([]byte("é"), 2048), []byte(nil))
	f.Fuzz(func(t *testing.T, user, network []byte) {
		dir := t.TempDir()
		out := filepath.Join(dir, "ci.iso")
		files := map[string][]byte{"user-data": user, "meta-data": []byte(`{"instance-id":"i"}`)}
		if len(network) > 0 {
			files["network-config"] = network
		}
		if err := launcher.WriteISO(out, launcher.NoCloudLabel, files, dir); err != nil {
			t.Fatal(err)
		}
		label, got := readISO(t, out)
		if label != launcher.NoCloudLabel || len(got) != len(files) {
			t.Fatalf("label %q, files %v", label, names(got))
		}
		for n, want := range files {
			if got[n] != string(want) {
				t.Fatalf("%s: got %d bytes, want %d", n, len(got[n]), len(want))
			}
		}
		if _, err := os.Stat(out + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("temporary image left behind: %v", err)
		}
	})
}
