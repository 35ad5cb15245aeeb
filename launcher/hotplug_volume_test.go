package launcher_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestVolumeHotplug attaches spec volumes (an emptyDisk and a hostDisk), described as the node
// agent describes them, to the running test guest through POST /v1/disks, sees them in the guest by serial, and detaches them again; bad requests
// are refused with the field named and leave the guest alone.
func TestVolumeHotplug(t *testing.T) {
	t.Parallel()
	v, c := boot(t)
	ctx := context.Background()

	virtio := func(name, serial string) v1alpha1.Disk {
		return v1alpha1.Disk{Name: name, Serial: serial, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}
	}
	emptyDisk := func(name, size string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{
			EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse(size)}}}
	}
	hostDisk := func(name, path string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{
			HostDisk: &v1alpha1.HostDisk{Path: path, Type: v1alpha1.HostDiskExists}}}
	}

	// hot is the disk the node agent sends for a spec disk and volume added to the running VMI.
	hot := func(d v1alpha1.Disk, vol v1alpha1.Volume) machine.Disk {
		t.Helper()
		md, err := translate.HotplugDisk(&v1alpha1.DomainSpec{}, &d, &vol, nil, field.NewPath("spec", "domain", "devices", "disks").Index(1))
		if err != nil {
			t.Fatalf("translate: %v", err)
		}
		return md
	}

	t.Run("bad requests are refused naming the field, the guest runs on", func(t *testing.T) {
		missing := filepath.Join(v.runDir, "no-such-image.img")
		sata := hot(virtio("data", ""), emptyDisk("data", "1Mi"))
		sata.Bus = machine.BusSATA
		cdrom := hot(virtio("data", ""), emptyDisk("data", "1Mi"))
		cdrom.CDROM, cdrom.ReadOnly = true, true
		placed := hot(virtio("data", ""), emptyDisk("data", "1Mi"))
		placed.Port = "hotplug0"
		cases := []struct {
			name  string
			req   machine.Disk
			field string
			msg   string
		}{
			{"missing host disk image", hot(virtio("data", ""), hostDisk("data", missing)), "source.hostFile.path", "no such file or directory"},
			{"cdrom", cdrom, "bus", "only a virtio disk"},
			{"sata bus", sata, "bus", "only a virtio disk"},
			{"a port chosen by the caller", placed, "port", "the launcher picks"},
			{"name of a disk the guest booted with", hot(virtio("scratch", ""), emptyDisk("scratch", "1Mi")), "name", "duplicate value"},
		}
		for _, tc := range cases {
			_, err := v.client.HotplugDisk(ctx, tc.req)
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != tc.field || !strings.Contains(apiErr.Msg, tc.msg) {
				t.Errorf("%s: want a 400 naming %s with %q, got %v (%+v)", tc.name, tc.field, tc.msg, err, apiErr)
			}
		}
		if _, err := os.Stat(filepath.Join(v.runDir, "empty-scratch.img")); err != nil {
			t.Errorf("the refused request touched the booted disk's image: %v", err)
		}
		st, err := v.client.Status(ctx)
		if err != nil || st.Phase != protocol.PhaseRunning || st.RunState != "running" || len(st.Hotplugged) != 0 {
			t.Fatalf("after the refusals: %v, phase %s, run state %s, hotplugged %v", err, st.Phase, st.RunState, st.Hotplugged)
		}
		from := len(c.Text())
		c.Send(t, "echo ALIVE-$((6*7))")
		c.Expect(t, from, "ALIVE-42", time.Minute)
	})

	// A raw host image with a marker the guest reads back.
	img := filepath.Join(v.runDir, "host.img")
	const marker = "QVIRT-HOSTDISK-MARK"
	if err := os.WriteFile(img, append([]byte(marker), make([]byte, 4<<20-len(marker))...), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("an emptyDisk and a hostDisk appear in the guest and go on unplug", func(t *testing.T) {
		empty, err := v.client.HotplugDisk(ctx, hot(virtio("empty", "EMPTY1"), emptyDisk("empty", "8Mi")))
		if err != nil {
			t.Fatalf("hotplug emptyDisk: %v", err)
		}
		emptyImage := filepath.Join(v.runDir, "empty-empty.img")
		if empty.Port == "" || empty.Source.Empty == nil {
			t.Fatalf("emptyDisk attached as %+v; want it on a root port", empty)
		}
		if _, err := os.Stat(emptyImage); err != nil {
			t.Fatalf("no emptyDisk image in the run directory: %v", err)
		}
		host, err := v.client.HotplugDisk(ctx, hot(virtio("host", "HOST1"), hostDisk("host", img)))
		if err != nil {
			t.Fatalf("hotplug hostDisk: %v", err)
		}
		if host.Source.HostFile == nil || host.Source.HostFile.Path != img || host.Port == empty.Port {
			t.Fatalf("hostDisk attached as %+v (emptyDisk on %s)", host, empty.Port)
		}

		from := len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -b /dev/vdc ] && break; sleep 1; done; ls /dev/vd*; for d in /sys/block/vd*; do echo "DEV-${d##*/}-$(cat $d/serial)-$(cat $d/size)"; done`)
		c.Expect(t, from, "DEV-vda-", time.Minute)
		c.Expect(t, from, "-EMPTY1-16384", time.Minute) // 8 MiB in 512-byte sectors
		end := c.Expect(t, from, "-HOST1-8192", time.Minute)
		text := c.Text()[from:end]
		dev := text[strings.LastIndex(text, "DEV-")+len("DEV-"):]
		dev = dev[:strings.Index(dev, "-")]
		from = len(c.Text())
		c.Send(t, "head -c 19 /dev/"+dev+"; echo")
		c.Expect(t, from, marker, time.Minute)

		st, err := v.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hot := map[string]bool{}
		for _, d := range st.Disks {
			hot[d.Name] = d.Hotplugged
		}
		if !hot["empty"] || !hot["host"] || hot["scratch"] || len(st.Hotplugged) != 2 {
			t.Fatalf("status disks %+v, hotplugged %+v", st.Disks, st.Hotplugged)
		}

		for _, name := range []string{"empty", "host"} {
			if err := v.client.UnplugDisk(ctx, name); err != nil {
				t.Fatalf("unplug %s: %v", name, err)
			}
		}
		from = len(c.Text())
		c.Send(t, `echo "LEFT-$(ls /sys/block | grep -c vd)"`)
		c.Expect(t, from, "LEFT-1", time.Minute)
		if _, err := os.Stat(emptyImage); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the emptyDisk image outlived its unplug: %v", err)
		}
		if _, err := os.Stat(img); err != nil {
			t.Errorf("unplug removed the host disk image: %v", err)
		}
		if st, _ := v.client.Status(ctx); len(st.Hotplugged) != 0 || len(st.Disks) != 1 {
			t.Fatalf("after unplug: disks %+v, hotplugged %+v", st.Disks, st.Hotplugged)
		}
	})

	t.Run("unplugging what is not hot-plugged names the field", func(t *testing.T) {
		for _, name := range []string{"empty", "scratch"} {
			err := v.client.UnplugDisk(ctx, name)
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "name" {
				t.Errorf("unplug %s: want a 400 naming name, got %v", name, err)
			}
		}
	})

	t.Run("an emptyDisk added again is blank", func(t *testing.T) {
		from := len(c.Text())
		if _, err := v.client.HotplugDisk(ctx, hot(virtio("empty", "EMPTY2"), emptyDisk("empty", "8Mi"))); err != nil {
			t.Fatalf("hotplug: %v", err)
		}
		path := filepath.Join(v.runDir, "empty-empty.img")
		c.Send(t, `for i in $(seq 30); do [ -b /dev/vdb ] && break; sleep 1; done; echo "WROTE-$(echo dirty > /dev/vdb && sync && echo ok)"`)
		c.Expect(t, from, "WROTE-ok", time.Minute)
		if data, err := os.ReadFile(path); err != nil || !strings.HasPrefix(string(data), "dirty") {
			t.Fatalf("the guest's write did not reach %s: %v", path, err)
		}
		if err := v.client.UnplugDisk(ctx, "empty"); err != nil {
			t.Fatal(err)
		}
		if _, err := v.client.HotplugDisk(ctx, hot(virtio("empty", "EMPTY3"), emptyDisk("empty", "8Mi"))); err != nil {
			t.Fatalf("hotplug again: %v", err)
		}
		from = len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -b /dev/vdb ] && break; sleep 1; done; echo "BLANK-$(head -c 5 /dev/vdb | grep -c dirty)"`)
		c.Expect(t, from, "BLANK-0", time.Minute)
	})
}
