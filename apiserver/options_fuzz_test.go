package apiserver

import (
	"errors"
	"testing"
)

// FuzzParseBodies feeds arbitrary bytes to every action body parser: none may panic, every
// refusal is a BadBodyError (answered 400), and an accepted addvolume body yields a volume and a
// disk of the requested name.
func FuzzParseBodies(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `{"gracePeriodSeconds": 3, "force": true}`, `{"paused": true}`, `{"dryRun": ["All"]}`,
		`{"name": "scratch", "volumeSource": {"emptyDisk": {"capacity": "64Mi"}}}`,
		`{"name": "d", "disk": {"name": "d", "disk": {"bus": "virtio"}}, "volumeSource": {"hostDisk": {"path": "/var/lib/x.img", "type": "DiskOrCreate", "capacity": "1Gi"}}}`,
		`{"name": "x"`, `[]`, `null`, `{"name": 3}`, `{} {}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		check := func(what string, err error) {
			var bad *BadBodyError
			if err != nil && !errors.As(err, &bad) {
				t.Errorf("%s: %T %v is not a BadBodyError", what, err, err)
			}
		}
		_, err := ParseStartOptions(body)
		check("start", err)
		_, err = ParseStopOptions(body)
		check("stop", err)
		_, err = ParseRestartOptions(body)
		check("restart", err)
		_, err = ParseMigrateOptions(body)
		check("migrate", err)
		_, err = ParseRemoveVolumeOptions(body)
		check("removevolume", err)
		vol, disk, err := ParseAddVolumeOptions(body)
		check("addvolume", err)
		if err == nil && (vol.Name == "" || vol.Name != disk.Name) {
			t.Errorf("addvolume accepted volume %q with disk %q", vol.Name, disk.Name)
		}
	})
}
