package config

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	c, err := Parse(map[string]string{
		"useEmulation": "true", "launcherImage": "reg/launcher:1", "parallelMigrationsPerCluster": "3",
		"parallelOutboundMigrationsPerNode": "1", "bandwidthPerMigration": "64Mi", "completionTimeoutPerGiB": "300",
		"memoryOverheadBase": "128Mi", "memoryOverheadPerVCPU": "8Mi", "memoryOverheadGuestRatio": "0",
		"allowedHostPaths": "/var/lib/qvirt, /data/images", "insecureRegistries": "10.243.0.1:5000, localhost:5001",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.UseEmulation || c.LauncherImage != "reg/launcher:1" || c.Migrations.ParallelPerCluster != 3 ||
		c.Migrations.ParallelOutboundPerNode != 1 || c.Migrations.BandwidthPerMigration.Value() != 64<<20 ||
		c.Migrations.CompletionTimeoutPerGiB != 300 || c.MemoryOverhead.Base.Value() != 128<<20 ||
		c.MemoryOverhead.PerVCPU.Value() != 8<<20 || c.MemoryOverhead.GuestRatio != 0 || len(c.AllowedHostPaths) != 2 ||
		len(c.InsecureRegistries) != 2 || c.InsecureRegistries[1] != "localhost:5001" {
		t.Fatalf("parsed %+v", c)
	}
	if empty, err := Parse(nil); err != nil || empty.Migrations.ParallelPerCluster != 5 || empty.Migrations.ParallelOutboundPerNode != 2 {
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
		"insecureRegistries":                "10.243.0.1",
		"launcherImage":                     "",
		"useEmulaton":                       "true", // a typo must not be ignored
	}
	for key, val := range cases {
		_, err := Parse(map[string]string{key: val})
		if err == nil || !strings.Contains(err.Error(), "data["+key+"]") {
			t.Errorf("%s=%q: want an error naming data[%s], got %v", key, val, key, err)
		}
	}
}

func TestHostPathAllowed(t *testing.T) {
	c := Default()
	c.AllowedHostPaths = []string{"/var/lib/qvirt"}
	for path, want := range map[string]bool{
		"/var/lib/qvirt/a.img": true, "/var/lib/qvirt": true, "/var/lib/qvirt2/a.img": false,
		"/var/lib/qvirt/../../etc/shadow": false, "/etc/shadow": false,
	} {
		if got := c.HostPathAllowed(path); got != want {
			t.Errorf("HostPathAllowed(%q) = %v, want %v", path, got, want)
		}
	}
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
