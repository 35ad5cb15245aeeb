package testutil

import (
	"os"
	"testing"
)

// HostNetNSDir is where ip-netns (and a CRI runtime, by default) keeps named network namespaces.
const HostNetNSDir = "/var/run/netns"

// HostNetNSes lists the names in HostNetNSDir: a test compares them before and after to find
// the namespaces it left.
func HostNetNSes(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(HostNetNSDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
