// Package launcher runs one virtual machine: it resolves a machine description (package machine,
// sent by the node agent or read by `qvirt-launcher run`) against the filesystem it sees, builds
// QEMU's command line, execs and supervises QEMU over QMP, serves the guest's DHCP lease and
// answers the node agent's commands on launcher.sock (package launcher/protocol). It links no Kubernetes package and
// makes no spec decision: defaults, MACs, the grace period and the CPU model arrive decided.
//
// Devices are units: one file per device kind holds everything QEMU needs for it, cold (its
// -device, -blockdev and other command-line arguments, with the checks on them) and, for the kinds
// that can be hot-plugged, hot (device_add, blockdev-add), in one form, so the two cannot drift:
//
//	disk.go      disks and cdroms: block nodes, virtio/sata/scsi devices, boot order (cold, hot)
//	nic.go       interfaces: tap netdevs, PCIe and legacy PCI NICs (cold, hot)
//	console.go   the QMP monitors and the serial console: chardevs on unix sockets (cold)
//	graphics.go  VGA with a VNC server on a unix socket, and screenshots (cold)
//	firmware.go  machine type, accelerator, ACPI, SMBIOS, direct kernel boot (cold)
//	cpu.go       CPU model, topology, memory (cold)
//
// Adding a device kind touches its new file (and one call in BuildArgv's list, which fixes where
// its arguments go on the command line), its type in package machine, the translation in
// handler/translate, and their tests; nothing else. argv.go only assembles the pieces in order and
// holds what belongs to no device: the QEMU process's identity and settings, the checks every
// device shares, and the PCI layout every device is placed in. A hot-pluggable kind's QMP verbs
// (hotplug.go) and routes (server.go) call into its file for the device itself.
package launcher
