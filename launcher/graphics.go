package launcher

import (
	"context"
	"fmt"
	"os"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// The graphics device kind: a video adapter (VGA unless the machine names another model) at a
// fixed PCI address (see the layout in argv.go) shown
// on a VNC server listening on a unix socket in RunDir, and the screenshot taken of it over QMP.
// The launcher attaches no display while the guest runs, so the device has only a cold form.

// graphicsPath is the machine field that decides whether the VM has a display.
const graphicsPath = machinePath + ".graphics"

// vgaSlot is the VGA's slot on pcie.0.
const vgaSlot = 0x01

// VNCSocket is the VNC display, when a graphics device is attached.
func (m *Machine) VNCSocket() string { return Dir(m.RunDir).VNC() }

// videoDrivers are QEMU's devices of the video models. ramfb is no PCI device: QEMU's firmware
// interface carries it, so it takes no slot.
var videoDrivers = map[string]string{
	machine.VideoVGA: "VGA", machine.VideoVirtio: "virtio-vga", machine.VideoBochs: "bochs-display",
	machine.VideoCirrus: "cirrus-vga", machine.VideoRamfb: "ramfb",
}

// graphics adds the VNC server and the video adapter, when the machine has a display.
func (b *builder) graphics() {
	if !b.m.Graphics {
		if b.m.Video != "" {
			b.fail(machine.Invalid(machinePath.Child("video"), b.m.Video, "a video model needs the graphics device"))
		}
		return
	}
	model := b.m.Video
	if model == "" {
		model = machine.VideoVGA
	}
	driver, ok := videoDrivers[model]
	if !ok {
		b.fail(machine.NotSupported(machinePath.Child("video"), model, []string{machine.VideoVGA, machine.VideoVirtio, machine.VideoBochs, machine.VideoCirrus, machine.VideoRamfb}))
		return
	}
	dev := fmt.Sprintf("%s,id=video0,bus=pcie.0,addr=%#x", driver, vgaSlot)
	if model == machine.VideoRamfb {
		dev = driver + ",id=video0"
	}
	b.add("-vnc", "unix:"+optEscape(b.m.VNCSocket()), "-device", dev)
}

// Screenshot captures the guest's display as a PNG. QEMU writes it (screendump, format png) to a
// new file in the VMI's run directory, which only QEMU's and the launcher's user can reach; the
// file is already unlinked when it is returned, so the caller only reads and closes it. A VM
// without a graphics device is refused with a *field.Error naming
// machine.graphics. A paused guest's last picture is still there.
func (l *Launcher) Screenshot(ctx context.Context) (*os.File, error) {
	p, err := l.process()
	if err != nil {
		return nil, err
	}
	m := p.Machine()
	if !m.Graphics {
		return nil, machine.Invalid(graphicsPath, false, "the VMI has no graphics device, so there is no screen to capture")
	}
	tmp, err := os.CreateTemp(m.RunDir, "screenshot-*.png")
	if err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	name := tmp.Name()
	_ = tmp.Close()
	defer os.Remove(name)
	if err := p.Monitor().Screendump(ctx, name, qmp.ScreendumpPNG); err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	// Open before the deferred remove: the open file outlives its name.
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("screenshot: read QEMU's %s: %w", name, err)
	}
	return f, nil
}
