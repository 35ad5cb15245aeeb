package config

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func TestParse(t *testing.T) {
	c, err := Parse(map[string]string{
		"useEmulation": "true", "launcherImage": "reg/launcher:1", "parallelMigrationsPerCluster": "3",
		"parallelOutboundMigrationsPerNode": "1", "bandwidthPerMigration": "64Mi", "completionTimeoutPerGiB": "300",
		"memoryOverheadBase": "128Mi", "memoryOverheadPerVCPU": "8Mi", "memoryOverheadGuestRatio": "0",
		"allowedHostPaths": "/var/lib/qvirt, /data/images", "insecureRegistries": "10.243.0.1:5000, localhost:5001",
		"evictionStrategy": "LiveMigrateIfPossible", "progressTimeout": "0", "vmStateStorageClass": "nfs-csi",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.UseEmulation || c.LauncherImage != "reg/launcher:1" || c.Migrations.ParallelPerCluster != 3 ||
		c.Migrations.ParallelOutboundPerNode != 1 || c.Migrations.BandwidthPerMigration.Value() != 64<<20 ||
		c.Migrations.CompletionTimeoutPerGiB != 300 || c.MemoryOverhead.Base.Value() != 128<<20 ||
		c.MemoryOverhead.PerVCPU.Value() != 8<<20 || c.MemoryOverhead.GuestRatio != 0 || len(c.AllowedHostPaths) != 2 ||
		len(c.InsecureRegistries) != 2 || c.InsecureRegistries[1] != "localhost:5001" ||
		c.EvictionStrategy != v1alpha1.EvictionStrategyLiveMigrateIfPossible || c.Migrations.ProgressTimeout != 0 ||
		c.VMStateStorageClass != "nfs-csi" {
		t.Fatalf("parsed %+v", c)
	}
	if empty, err := Parse(nil); err != nil || empty.Migrations.ParallelPerCluster != 5 || empty.Migrations.ParallelOutboundPerNode != 2 || empty.Migrations.ProgressTimeout != 150 {
		t.Fatalf("defaults: %+v, %v", empty, err)
	}
}

func TestParseRefusesNamingTheKey(t *testing.T) {
	cases := map[string]string{
		"useEmulation":                      "maybe",
		"parallelMigrationsPerCluster":      "0",
		"parallelOutboundMigrationsPerNode": "two",
		"bandwidthPerMigration":             "-1Mi",
		"memoryOverheadBase":                "lots",
		"memoryOverheadGuestRatio":          "-2",
		"allowedHostPaths":                  "relative/path",
		"hostDiskNamespaces":                "Team_A",
		"insecureRegistries":                "10.243.0.1",
		"launcherImage":                     "",
		"evictionStrategy":                  "Migrate",
		"progressTimeout":                   "-1",
		"vmStateStorageClass":               "NFS_CSI",
		"useEmulaton":                       "true", // a typo must not be ignored
	}
	for key, val := range cases {
		_, err := Parse(map[string]string{key: val})
		if err == nil || !strings.Contains(err.Error(), "data["+key+"]") {
			t.Errorf("%s=%q: want an error naming data[%s], got %v", key, val, key, err)
		}
	}
}

// TestHostDiskDir: an instance's host disk must lie strictly inside its own namespace's directory
// under an allowed path, named cleanly, and only in a namespace hostDisk is enabled for.
func TestHostDiskDir(t *testing.T) {
	c, err := Parse(map[string]string{"allowedHostPaths": "/var/lib/qvirt,/data", "hostDiskNamespaces": "team-a, team-b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns, path, dir string
	}{
		{"team-a", "/var/lib/qvirt/team-a/disk.img", "/var/lib/qvirt/team-a"},
		{"team-a", "/data/team-a/vms/a/disk.img", "/data/team-a"},
		{"team-b", "/var/lib/qvirt/team-b/x.img", "/var/lib/qvirt/team-b"},
		{"team-a", "/var/lib/qvirt/team-b/x.img", ""},           // another tenant's
		{"team-c", "/var/lib/qvirt/team-c/x.img", ""},           // not enabled
		{"team-a", "/var/lib/qvirt/team-a", ""},                 // the directory itself
		{"team-a", "/var/lib/qvirt/team-a/", ""},                // not clean
		{"team-a", "/var/lib/qvirt/team-a/../team-b/x.img", ""}, // not clean
		{"team-a", "/var/lib/qvirt/team-a/./x.img", ""},         // not clean
		{"team-a", "/var/lib/qvirt/team-a2/x.img", ""},          // a prefix, not a directory
		{"team-a", "/var/lib/qvirt/x.img", ""},
		{"team-a", "/etc/shadow", ""},
		{"", "/var/lib/qvirt//x.img", ""},
	} {
		dir, ok := c.HostDiskDir(tc.ns, tc.path)
		if dir != tc.dir || ok != (tc.dir != "") {
			t.Errorf("HostDiskDir(%q, %q) = %q, %v; want %q", tc.ns, tc.path, dir, ok, tc.dir)
		}
	}
	if dirs := Default().HostDiskDirs("team-a"); len(dirs) != 0 {
		t.Errorf("the default configuration enables host disks: %v", dirs)
	}
}

// FuzzHostDiskDir: whatever the path, a directory HostDiskDir accepts it under is the namespace's
// own under an allowed path, and the path is clean and strictly inside it.
func FuzzHostDiskDir(f *testing.F) {
	f.Add("team-a", "/var/lib/qvirt/team-a/disk.img")
	f.Add("team-a", "/var/lib/qvirt/team-a/../team-b/disk.img")
	f.Add("team-b", "/var/lib/qvirt/team-b")
	c, err := Parse(map[string]string{"allowedHostPaths": "/var/lib/qvirt", "hostDiskNamespaces": "team-a,team-b"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ns, path string) {
		dir, ok := c.HostDiskDir(ns, path)
		if !ok {
			return
		}
		if dir != "/var/lib/qvirt/"+ns || filepath.Clean(path) != path || !strings.HasPrefix(path, dir+"/") {
			t.Fatalf("HostDiskDir(%q, %q) accepted it under %q", ns, path, dir)
		}
	})
}

// FuzzParse: any ConfigMap content parses or is refused with the key named; never a panic.
func FuzzParse(f *testing.F) {
	f.Add("useEmulation", "true")
	f.Add("bandwidthPerMigration", "64Mi")
	f.Add("allowedHostPaths", "/a,/b")
	f.Add("insecureRegistries", "10.243.0.1:5000,[::1]:5000")
	f.Fuzz(func(t *testing.T, key, val string) {
		_, err := Parse(map[string]string{key: val})
		if err != nil && !strings.Contains(err.Error(), "data[") {
			t.Fatalf("error does not name the key: %v", err)
		}
	})
}

// TestEvictionStrategyFor: the instance's own strategy wins, then the cluster's, then None.
func TestEvictionStrategyFor(t *testing.T) {
	cluster, err := Parse(map[string]string{"evictionStrategy": "LiveMigrate"})
	if err != nil {
		t.Fatal(err)
	}
	own := &v1alpha1.VirtualMachineInstanceSpec{EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyExternal)}
	for _, tc := range []struct {
		cfg  Config
		spec *v1alpha1.VirtualMachineInstanceSpec
		want v1alpha1.EvictionStrategy
	}{
		{Default(), &v1alpha1.VirtualMachineInstanceSpec{}, v1alpha1.EvictionStrategyNone},
		{cluster, &v1alpha1.VirtualMachineInstanceSpec{}, v1alpha1.EvictionStrategyLiveMigrate},
		{cluster, own, v1alpha1.EvictionStrategyExternal},
	} {
		if got := tc.cfg.EvictionStrategyFor(tc.spec); got != tc.want {
			t.Errorf("cluster %q, instance %v: got %s, want %s", tc.cfg.EvictionStrategy, tc.spec.EvictionStrategy, got, tc.want)
		}
	}
}
