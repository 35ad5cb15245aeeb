package launcher

import (
	"fmt"
	"strconv"

	"github.com/qvirt/qvirt/machine"
)

// The input device kind: tablets (absolute pointers) on USB or virtio. A USB tablet sits on the
// machine's one xHCI controller (qemu-xhci), which the builder adds on its own root port when the
// machine has a USB input; a virtio tablet is a virtio-input PCI device on its own root port. Both
// are fixed when QEMU starts (the launcher hot-plugs no input device), so they have only a cold
// form.
//
// The USB redirection slots (KubeVirt's clientPassthrough) sit on the same controller.

// USBControllerID is the -device id of the xHCI controller; its bus is "<id>.0".
const USBControllerID = "usb"

// usbPorts is how many USB 2 and USB 3 ports the controller gets: room for every input the API
// admits (v1alpha1.MaxInputs).
const usbPorts = "8"

// InputDeviceID is the -device id of an input device: "input-<name>".
func InputDeviceID(name string) string { return "input-" + name }

// inputDrivers are QEMU's devices for each bus and type.
var inputDrivers = map[machine.InputBus]map[machine.InputType]string{
	machine.InputUSB:    {machine.InputTablet: "usb-tablet"},
	machine.InputVirtio: {machine.InputTablet: "virtio-tablet-pci"},
}

// inputs adds the xHCI controller when a USB input needs it, then every input in order.
func (b *builder) inputs() {
	for i, in := range b.m.Inputs {
		p := machinePath.Child("inputs").Index(i)
		if !b.unique(p.Child("name"), "input", in.Name) {
			continue
		}
		drivers, ok := inputDrivers[in.Bus]
		if !ok {
			b.fail(machine.NotSupported(p.Child("bus"), in.Bus, []string{string(machine.InputUSB), string(machine.InputVirtio)}))
			continue
		}
		driver, ok := drivers[in.Type]
		if !ok {
			b.fail(machine.NotSupported(p.Child("type"), in.Type, []string{string(machine.InputTablet)}))
			continue
		}
		id := InputDeviceID(in.Name)
		if in.Bus == machine.InputVirtio {
			b.devs = append(b.devs, "-device", driver+",id="+id+",bus="+b.rootPort("port-"+id))
			continue
		}
		b.usbController()
		b.devs = append(b.devs, "-device", driver+",id="+id+",bus="+USBControllerID+".0")
	}
}

// usbController adds the machine's xHCI controller, once, on its own root port.
func (b *builder) usbController() {
	if b.usb {
		return
	}
	b.usb = true
	b.devs = append(b.devs, "-device", "qemu-xhci,id="+USBControllerID+",bus="+b.rootPort("port-"+USBControllerID)+",p2="+usbPorts+",p3="+usbPorts)
}

// USBRedirID is the id of USB redirection slot n's chardev and usb-redir device.
func USBRedirID(n int) string { return "usbredir" + strconv.Itoa(n) }

// usbRedirs adds the USB redirection slots: each a usb-redir device on the xHCI controller, fed by
// a socket QEMU listens on. QEMU speaks usbredir's guest side there: a client that connects plugs
// its device in, and unplugs it by leaving.
func (b *builder) usbRedirs() {
	n := b.m.USBRedirSlots
	if n == 0 {
		return
	}
	if n < 0 || n > machine.MaxUSBRedirSlots {
		b.fail(machine.Invalid(machinePath.Child("usbRedirSlots"), n, fmt.Sprintf("must be from 0 to %d", machine.MaxUSBRedirSlots)))
		return
	}
	b.usbController()
	dir := Dir(b.m.RunDir)
	for i := range n {
		id := USBRedirID(i)
		b.devs = append(b.devs, "-chardev", "socket,id="+id+",path="+optEscape(dir.USBRedir(i))+",server=on,wait=off",
			"-device", "usb-redir,chardev="+id+",id="+id+",bus="+USBControllerID+".0")
	}
}
