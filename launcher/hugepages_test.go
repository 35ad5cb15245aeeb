package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestHugepages boots the test guest with KubeVirt's memory.hugepages (2Mi): QEMU maps the
// guest's whole RAM from the host's pool of 2 MiB pages, which the test reserves for it (and gives
// back after), and the guest runs. A live migration of it under TCG is refused naming the field,
// since QEMU 7.2 loses guest writes migrating such RAM under emulation.
func TestGuestHugepages(t *testing.T) {
	vmi := guestVMI(t)
	guestMiB := v1alpha1.GuestMemoryMiB(&vmi.Spec.Domain)
	testutil.ReserveHugepages(t, int(guestMiB/2))
	vmi.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
	v, _ := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	st, err := v.client.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := hugePageMappingKiB(t, st.PID); got != guestMiB<<10 {
		t.Errorf("QEMU maps %d KiB of 2 MiB pages, want the guest's %d MiB", got, guestMiB)
	}

	err = v.client.MigrateSource(context.Background(), protocol.MigrationSource{URI: "tcp:127.0.0.1:9"})
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) || apiErr.Field != "machine.hugePageKiB" || !strings.Contains(apiErr.Msg, "under emulation") {
		t.Errorf("migrate: %v (field %q), want a refusal at machine.hugePageKiB", err, fieldOf(apiErr))
	}
}

// hugePageMappingKiB is the size of the largest of pid's mappings made of 2 MiB pages.
func hugePageMappingKiB(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var size, largest int64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 3 && f[0] == "Size:":
			size, _ = strconv.ParseInt(f[1], 10, 64)
		case len(f) == 3 && f[0] == "KernelPageSize:" && f[1] == "2048":
			largest = max(largest, size)
		}
	}
	return largest
}
