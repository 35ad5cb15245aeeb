package launcher

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestBuildArgvPlacedNICs: a migration target's hot-plugged NIC goes on the spare root port it had,
// with HotplugNIC's device properties, without adding a root port; a bad placement is refused with
// its field named.
func TestBuildArgvPlacedNICs(t *testing.T) {
	placed := func(mutate func(*PlacedNIC)) *Machine {
		m := fullMachine(t)
		n := PlacedNIC{Port: "hotplug2", NICHotplug: NICHotplug{Name: "extra", Tap: "tap9", MAC: "02:00:00:00:09:09", Model: "e1000e"}}
		if mutate != nil {
			mutate(&n)
		}
		m.HotplugNICs = []PlacedNIC{n}
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

	for _, tc := range []struct {
		name   string
		mutate func(*PlacedNIC)
		path   string
	}{
		{"name of a spec interface", func(n *PlacedNIC) { n.Name = "storage" }, "machine.hotplugNICs[0].name"},
		{"MAC of a spec interface", func(n *PlacedNIC) { n.MAC = "02:00:00:aa:bb:02" }, "machine.hotplugNICs[0].mac"},
		{"no spare port", func(n *PlacedNIC) { n.Port = "hotplug4" }, "machine.hotplugNICs[0].port"},
		{"a cold device's port", func(n *PlacedNIC) { n.Port = "port-nic-default" }, "machine.hotplugNICs[0].port"},
		{"bad tap", func(n *PlacedNIC) { n.Tap = "tap,vhost=on" }, "machine.hotplugNICs[0].tap"},
		{"model that cannot be hot-plugged", func(n *PlacedNIC) { n.Model = "e1000" }, "machine.hotplugNICs[0].model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := BuildArgv(placed(tc.mutate))
			var fe *field.Error
			if !errors.As(err, &fe) || fe.Field != tc.path {
				t.Fatalf("want an error at %s, got %v", tc.path, err)
			}
		})
	}

	t.Run("port of a placed disk", func(t *testing.T) {
		m := placed(nil)
		m.Hotplugged = []DiskHotplug{{Name: "hot", Path: "/hot.raw", Format: "raw", Port: "hotplug2"}}
		_, err := BuildArgv(m)
		var fe *field.Error
		if !errors.As(err, &fe) || fe.Field != "machine.hotplugNICs[0].port" || !strings.Contains(fmt.Sprint(fe.BadValue), `disk "hot"`) {
			t.Fatalf("want a duplicate port at machine.hotplugNICs[0].port naming the disk, got %v", err)
		}
	})
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
