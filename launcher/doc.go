// Package launcher runs one virtual machine: it resolves a machine description (package machine,
// sent by the node agent or read by `qvirt-launcher run`) against the filesystem it sees, builds
// QEMU's command line, execs and supervises QEMU over QMP, serves the guest's DHCP lease and
// answers the node agent's commands on launcher.sock (api.go). It links no Kubernetes package and
// makes no spec decision: defaults, MACs, the grace period and the CPU model arrive decided.
//
// Devices are units: one file per device kind holds what QEMU needs for it both cold (its -device
// and -blockdev arguments) and hot (device_add, blockdev-add), in one form, so the two cannot
// drift (disk.go, nic.go). Adding a device kind touches that file, its type in package machine,
// the translation in handler/translate, and their tests; nothing else. argv.go holds the machine
// itself (identity, CPU, memory, kernel, consoles, graphics) and the PCI layout every device is
// placed in.
package launcher
