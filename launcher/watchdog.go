package launcher

import (
	"github.com/qvirt/qvirt/machine"
)

// The watchdog device kind: an Intel 6300ESB, a conventional PCI device on pcie.0 (a legacy slot,
// as the legacy NICs: see the layout in argv.go), and QEMU's action when it expires
// (-action watchdog=). KubeVirt's actions are QEMU's by the same names: poweroff ends QEMU as a
// power cut, reset resets the guest, shutdown presses the ACPI power button. It is fixed when
// QEMU starts, so it has only a cold form.

// WatchdogDeviceID is the -device id of the watchdog: "watchdog-<name>".
func WatchdogDeviceID(name string) string { return "watchdog-" + name }

var watchdogActions = []string{string(machine.WatchdogPoweroff), string(machine.WatchdogReset), string(machine.WatchdogShutdown)}

// watchdog adds the watchdog device and its action, when the machine has one.
func (b *builder) watchdog() {
	w := b.m.Watchdog
	if w == nil {
		return
	}
	p := machinePath.Child("watchdog")
	ok := b.unique(p.Child("name"), "watchdog", w.Name)
	if w.Model != machine.WatchdogI6300ESB {
		b.fail(machine.NotSupported(p.Child("model"), w.Model, []string{machine.WatchdogI6300ESB}))
		ok = false
	}
	switch w.Action {
	case machine.WatchdogPoweroff, machine.WatchdogReset, machine.WatchdogShutdown:
	default:
		b.fail(machine.NotSupported(p.Child("action"), w.Action, watchdogActions))
		ok = false
	}
	if !ok {
		return
	}
	b.add("-action", "watchdog="+string(w.Action))
	b.devs = append(b.devs, "-device", "i6300esb,id="+WatchdogDeviceID(w.Name)+",bus=pcie.0,addr="+b.legacySlot())
}
