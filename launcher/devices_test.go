package launcher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestDevices boots the test guest once with KubeVirt's devices that need no host side, as
// a KubeVirt manifest writes them (spec.domain.devices.rng, autoattachMemBalloon, sound, video,
// inputs, watchdog, a disk's blockSize,
// spec.domain.features and spec.domain.clock), translated as the node agent does, and finds each
// in the guest. The guest has no udev, so the shell loads each driver (they are in the initramfs,
// test/guest).
func TestGuestDevices(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	d := &vmi.Spec.Domain
	// A Windows manifest's platform (KubeVirt's vmi-windows example): its Hyper-V enlightenments,
	// which this emulated node leaves out (hv-vpindex alone would stop QEMU under TCG), SMM turned
	// off, and a clock ten years ahead of UTC without an HPET.
	d.Features = &v1alpha1.Features{APIC: &v1alpha1.FeatureAPIC{}, SMM: &v1alpha1.FeatureState{Enabled: ptr(false)},
		KVM: &v1alpha1.FeatureKVM{Hidden: true}, Hyperv: &v1alpha1.FeatureHyperv{Relaxed: &v1alpha1.FeatureState{},
			VAPIC: &v1alpha1.FeatureState{}, VPIndex: &v1alpha1.FeatureState{}, SyNICTimer: &v1alpha1.SyNICTimer{},
			Spinlocks: &v1alpha1.FeatureSpinlocks{Retries: ptr[uint32](8191)}}}
	const tenYears = 3652 * 24 * 3600
	d.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{OffsetSeconds: ptr(tenYears)}},
		Timer: &v1alpha1.Timer{HPET: &v1alpha1.HPETTimer{Enabled: ptr(false)}, PIT: &v1alpha1.PITTimer{TickPolicy: v1alpha1.PITTickPolicyDelay},
			RTC: &v1alpha1.RTCTimer{TickPolicy: v1alpha1.RTCTickPolicyCatchup, Track: v1alpha1.TrackGuest}, Hyperv: &v1alpha1.HypervTimer{}}}
	started := time.Now().UTC()
	d.Devices.Rng = &v1alpha1.Rng{}
	d.Devices.AutoattachMemBalloon = ptr(true)
	d.Devices.Sound = &v1alpha1.SoundDevice{Name: "speaker"} // ich9 by default
	d.Devices.AutoattachGraphicsDevice, d.Devices.Video = ptr(true), &v1alpha1.VideoDevice{Type: v1alpha1.VideoVirtio}
	d.Devices.Inputs = []v1alpha1.Input{
		{Name: "tablet", Type: v1alpha1.InputTypeTablet}, // bus usb by default
		{Name: "vtablet", Type: v1alpha1.InputTypeTablet, Bus: v1alpha1.InputBusVirtio},
	}
	d.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: v1alpha1.WatchdogActionShutdown}}
	// The disk tuning (guestVMI's emptyDisk scratch is a virtio disk).
	d.CPU = &v1alpha1.CPU{Cores: 2}
	d.Devices.BlockMultiQueue = ptr(true)
	d.IOThreadsPolicy = ptr(v1alpha1.IOThreadsPolicyShared)
	d.Devices.Disks[0].Shareable = ptr(true)
	d.Devices.Disks[0].BlockSize = &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 4096, Physical: 8192}}

	v, c := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	ctx := context.Background()

	// Each command's output differs from its echo (test/guest/README.md).
	run := func(t *testing.T, line, want string) {
		t.Helper()
		from := len(c.Text())
		c.Send(t, line)
		c.Expect(t, from, want, time.Minute)
	}
	t.Run("the CPU has a local APIC", func(t *testing.T) {
		run(t, `grep -qw apic /proc/cpuinfo && echo APIC-$((40+2))`, "APIC-42")
	})
	t.Run("the RTC starts ten years ahead of UTC", func(t *testing.T) {
		// The date the RTC started at, or a day later should the boot have crossed midnight.
		from := len(c.Text())
		c.Send(t, `echo "RTC-[$(cat /sys/class/rtc/rtc0/date)]"`)
		// The date is read once its closing bracket is on the console, not as soon as it begins.
		end := c.Expect(t, c.Expect(t, from, "RTC-[2", time.Minute), "]", time.Minute)
		text := c.Text()[from:end]
		var ok bool
		for _, day := range []time.Time{started, started.Add(24 * time.Hour)} {
			ok = ok || strings.Contains(text, "RTC-["+day.Add(tenYears*time.Second).Format("2006-01-02")+"]")
		}
		if !ok {
			t.Fatalf("the guest's RTC date is not ten years from %s: %q", started.Format("2006-01-02"), testutil.Tail(text, 200))
		}
	})
	t.Run("there is no HPET", func(t *testing.T) {
		run(t, `echo "HPET-$(grep -c hpet /sys/devices/system/clocksource/clocksource0/available_clocksource)"`, "HPET-0")
	})
	t.Run("the Hyper-V enlightenments are left out under emulation", func(t *testing.T) {
		run(t, `echo "HYPERV-$(dmesg | grep -ci hyper-v)"`, "HYPERV-0")
	})
	t.Run("QEMU has SMM off and no HPET", func(t *testing.T) {
		mon := dialWhenListening(t, launcher.Dir(v.runDir).ShellQMP())
		defer mon.Close()
		for prop, want := range map[string]string{"smm": `"off"`, "hpet": "false"} {
			got, err := mon.Execute(ctx, "qom-get", map[string]string{"path": "/machine", "property": prop})
			if err != nil || string(got) != want {
				t.Errorf("%s of the machine: %s %v, want %s", prop, got, err, want)
			}
		}
	})
	t.Run("virtio-rng is the guest's hardware RNG and gives bytes", func(t *testing.T) {
		run(t, `modprobe virtio_rng; echo "RNG-[$(cat /sys/class/misc/hw_random/rng_available)]"`, "RNG-[virtio_rng.0")
		run(t, `echo "RNGCUR-[$(cat /sys/class/misc/hw_random/rng_current)]"`, "RNGCUR-[virtio_rng.0]")
		run(t, `echo "RNGREAD-$(head -c 64 /dev/hwrng | wc -c)"`, "RNGREAD-64")
	})
	t.Run("the USB and virtio tablets are input devices", func(t *testing.T) {
		// The USB tablet appears once the xHCI controller has enumerated it.
		run(t, `modprobe xhci_pci; modprobe usbhid; modprobe hid_generic; modprobe virtio_input; `+
			`for i in $(seq 60); do [ "$(grep -c Tablet /proc/bus/input/devices)" = 2 ] && break; sleep 1; done; `+
			`grep Name= /proc/bus/input/devices`, `N: Name="QEMU QEMU USB Tablet"`)
		if text := c.Text(); !strings.Contains(text, `N: Name="QEMU Virtio Tablet"`) {
			t.Fatalf("no virtio tablet in /proc/bus/input/devices; console ends with %q", testutil.Tail(text, 600))
		}
	})
	t.Run("the memory balloon reports free pages", func(t *testing.T) {
		// Feature bit 5 of a virtio balloon is VIRTIO_BALLOON_F_REPORTING, negotiated by the driver.
		run(t, `modprobe virtio_balloon; b=$(ls -d /sys/bus/virtio/drivers/virtio_balloon/virtio* | head -1); `+
			`echo "BALLOON-[$(basename $b)]-[$(cut -c6 $b/features)]"`, "]-[1]")
		if text := c.Text(); !strings.Contains(text, "BALLOON-[virtio") {
			t.Fatalf("no virtio_balloon device in the guest; console ends with %q", testutil.Tail(text, 600))
		}
	})
	t.Run("the sound card is an Intel HD Audio with QEMU's codec", func(t *testing.T) {
		// Under emulation on a loaded machine the driver can give up on the codec's first answer
		// ("Cannot probe codecs"); loading it again probes again.
		from := len(c.Text())
		c.Send(t, `modprobe snd_hda_codec_generic; for try in 1 2 3; do modprobe snd_hda_intel; for i in $(seq 20); do `+
			`grep -q . /proc/asound/card0/codec#0 2>/dev/null && break 2; sleep 1; done; rmmod snd_hda_intel; done; `+
			`echo "SND-[$(grep -m1 Codec: /proc/asound/card0/codec#0)]-[$(cat /proc/asound/card0/id)]"`)
		c.Expect(t, from, "]-[Intel]", 2*time.Minute)
		if text := c.Text(); !strings.Contains(text, "SND-[Codec: QEMU") {
			t.Fatalf("no QEMU codec on the guest's HD Audio card; console ends with %q", testutil.Tail(text, 600))
		}
	})
	t.Run("the video adapter is virtio-gpu with VGA", func(t *testing.T) {
		// 1af4:1050 is a modern virtio GPU; its class 0x0300 a VGA-compatible controller.
		run(t, `v=/sys/bus/pci/devices/0000:00:01.0; echo "VIDEO-[$(cat $v/vendor):$(cat $v/device):$(cat $v/class)]"`, "VIDEO-[0x1af4:0x1050:0x030000]")
	})
	t.Run("blockMultiQueue gives the disk a queue per vCPU", func(t *testing.T) {
		run(t, `echo "MQ-[$(ls /sys/block/vda/mq | wc -l)]"`, "MQ-[2]")
	})
	t.Run("the disk has the custom block sizes", func(t *testing.T) {
		run(t, `q=/sys/block/vda/queue; echo "BS-[$(cat $q/logical_block_size)/$(cat $q/physical_block_size)]"`, "BS-[4096/8192]")
	})
	t.Run("the disk runs in the shared I/O thread and takes no write lock", func(t *testing.T) {
		mon := dialWhenListening(t, launcher.Dir(v.runDir).ShellQMP())
		defer mon.Close()
		dev := "/machine/peripheral/" + launcher.DiskDeviceID("scratch")
		for prop, want := range map[string]string{"iothread": `"/objects/iothread-shared"`, "share-rw": "true"} {
			got, err := mon.Execute(ctx, "qom-get", map[string]string{"path": dev, "property": prop})
			if err != nil || string(got) != want {
				t.Errorf("%s of the disk: %s %v, want %s", prop, got, err, want)
			}
		}
	})
	t.Run("the i6300esb watchdog presses the power button when it expires", func(t *testing.T) {
		run(t, `modprobe i6300esb heartbeat=2; echo "WDT-[$(cat /sys/class/watchdog/watchdog0/identity)]"`, "WDT-[i6300ESB timer]")
		// Writing to the device starts it; closing it without the magic 'V' leaves it running.
		from := len(c.Text())
		c.Send(t, `echo 1 > /dev/watchdog`)
		c.Expect(t, from, "QVIRT-POWERDOWN", 2*time.Minute)
		waitFor(t, time.Minute, "QEMU to exit", func() bool {
			st, err := v.client.Status(ctx)
			return err == nil && st.Exit != nil
		})
		st, _ := v.client.Status(ctx)
		if st.Exit.Reason != protocol.ExitGuestShutdown {
			t.Fatalf("exit reason %q (%s), want %q: the shutdown action is the ACPI power button", st.Exit.Reason, st.Exit.Detail, protocol.ExitGuestShutdown)
		}
	})
}
