package launcher

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/machine"
)

// TestBuildArgvPlacedNICs: a migration target's hot-plugged NIC goes on the spare root port it had,
// with HotplugNIC's device, without adding a root port; a bad placement is refused with its field
// named.
func TestBuildArgvPlacedNICs(t *testing.T) {
	placed := func(mutate func(*machine.NIC)) *Machine {
		m := fullMachine(t)
		n := machine.NIC{Port: "hotplug2", Name: "extra", Tap: "tap9", MAC: "02:00:00:00:09:09", Model: machine.NICE1000E}
		if mutate != nil {
			mutate(&n)
		}
		m.NICs = append(m.NICs, n)
		return m
	}
	before, err := BuildArgv(fullMachine(t))
	if err != nil {
		t.Fatal(err)
	}
	argv, err := BuildArgv(placed(nil))
	if err != nil {
		t.Fatal(err)
	}
	wantDev := `{"bus":"hotplug2","driver":"e1000e","id":"nic-extra","mac":"02:00:00:00:09:09","netdev":"net-extra","romfile":""}`
	if !slices.Contains(argv, wantDev) || !slices.Contains(argv, "tap,id=net-extra,ifname=tap9,script=no,downscript=no") {
		t.Errorf("argv lacks the placed NIC's netdev and device %q:\n%s", wantDev, strings.Join(argv, "\n"))
	}
	if got, want := rootPortCount(argv), rootPortCount(before); got != want {
		t.Errorf("%d root ports with the placed NIC, %d without: it must sit on a spare one", got, want)
	}
	// The cold NICs' devices are exactly what HotplugNIC adds for a NIC of the same model.
	if !slices.Contains(argv, `{"bus":"port-nic-default","driver":"virtio-net-pci","id":"nic-default","mac":"02:00:00:aa:bb:01","netdev":"net-default","romfile":""}`) {
		t.Errorf("the cold virtio NIC is not in device_add's form:\n%s", strings.Join(argv, "\n"))
	}

	for _, tc := range []struct {
		name   string
		mutate func(*machine.NIC)
		path   string
	}{
		{"name of a cold interface", func(n *machine.NIC) { n.Name = "storage" }, "machine.nics[2].name"},
		{"MAC of a cold interface", func(n *machine.NIC) { n.MAC = "02:00:00:aa:bb:02" }, "machine.nics[2].mac"},
		{"no spare port", func(n *machine.NIC) { n.Port = "hotplug4" }, "machine.nics[2].port"},
		{"a cold device's port", func(n *machine.NIC) { n.Port = "port-nic-default" }, "machine.nics[2].port"},
		{"bad tap", func(n *machine.NIC) { n.Tap = "tap,vhost=on" }, "machine.nics[2].tap"},
		{"model that cannot be hot-plugged", func(n *machine.NIC) { n.Model = machine.NICE1000 }, "machine.nics[2].port"},
		{"queues on an e1000e", func(n *machine.NIC) { n.Queues = 2 }, "machine.nics[2].queues"},
		{"more queues than a tap has", func(n *machine.NIC) { n.Model, n.Queues = machine.NICVirtio, 257 }, "machine.nics[2].queues"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := BuildArgv(placed(tc.mutate))
			var ime *InvalidMachineError
			if !errors.As(err, &ime) || !slices.ContainsFunc(ime.Errs, func(e *machine.FieldError) bool { return e.Field == tc.path }) {
				t.Fatalf("want an error at %s, got %v", tc.path, err)
			}
		})
	}

	t.Run("port of a placed disk", func(t *testing.T) {
		m := placed(nil)
		m.Disks[1].Port = "hotplug2"
		_, err := BuildArgv(m)
		var fe *machine.FieldError
		if !errors.As(err, &fe) || fe.Field != "machine.nics[2].port" || !strings.Contains(fe.Detail, `disk "data"`) {
			t.Fatalf("want a duplicate port at machine.nics[2].port naming the disk, got %v", err)
		}
	})
}

// TestBuildArgvMultiQueueNIC: a virtio NIC with queue pairs opens that many tap queues and has
// multi-queue on, with a vector for each queue, the control queue and config changes; hot-plugged
// the same.
func TestBuildArgvMultiQueueNIC(t *testing.T) {
	m := fullMachine(t)
	m.NICs[0].Queues = 4
	argv, err := BuildArgv(m)
	if err != nil {
		t.Fatal(err)
	}
	wantDev := `{"bus":"port-nic-default","driver":"virtio-net-pci","id":"nic-default","mac":"02:00:00:aa:bb:01","mq":true,"netdev":"net-default","romfile":"","vectors":10}`
	if !slices.Contains(argv, wantDev) || !slices.ContainsFunc(argv, func(a string) bool {
		return strings.HasPrefix(a, "tap,id=net-default,") && strings.HasSuffix(a, ",queues=4")
	}) {
		t.Errorf("argv lacks the 4-queue NIC's netdev and device %q:\n%s", wantDev, strings.Join(argv, "\n"))
	}
}

func rootPortCount(argv []string) int {
	n := 0
	for _, a := range argv {
		if strings.HasPrefix(a, "pcie-root-port,") {
			n++
		}
	}
	return n
}
