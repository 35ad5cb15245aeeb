package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestDedicatedCPUs boots the test guest with KubeVirt's dedicatedCpuPlacement under the
// launcher's own CPUs (this process's, two or more here): each vCPU thread of QEMU is pinned to
// one CPU of its own, in order, and QEMU's other threads share the vCPUs' CPUs; with
// isolateEmulatorThread they are on the next CPU, away from the vCPU. The guest sees its vCPUs. A
// machine that needs more CPUs than the launcher may run on is refused before the guest runs,
// naming the field.
func TestGuestDedicatedCPUs(t *testing.T) {
	t.Parallel()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for c := 0; c < 1024; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		t.Fatalf("this test needs at least 2 CPUs to run on, has %v", cpus)
	}
	list := func(cs ...int) string {
		var s []string
		for _, c := range cs {
			s = append(s, strconv.Itoa(c))
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name             string
		sockets          uint32
		isolate          bool
		vcpus, emulator  string
		guestSeesProcess string
	}{
		{"two vCPUs", 2, false, list(cpus[0], cpus[1]), list(cpus[0], cpus[1]), "2"},
		{"isolated emulator thread", 1, true, list(cpus[0]), list(cpus[1]), "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := guestVMI(t)
			vmi.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: tc.sockets, Cores: 1, Threads: 1, DedicatedCPUPlacement: true, IsolateEmulatorThread: tc.isolate}
			v, c := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
			st, err := v.client.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			vcpu, other := qemuThreadCPUs(t, st.PID)
			var got []string
			for i := 0; i < int(tc.sockets); i++ {
				got = append(got, vcpu[fmt.Sprintf("CPU %d/TCG", i)])
			}
			if strings.Join(got, ",") != tc.vcpus {
				t.Errorf("vCPU threads run on %v, want one each on %s (threads: %v)", got, tc.vcpus, vcpu)
			}
			for name, l := range other {
				if canonicalCPUList(l) != tc.emulator {
					t.Errorf("QEMU thread %q runs on %s, want %s", name, l, tc.emulator)
				}
			}
			from := len(c.Text())
			c.Send(t, `echo PIN-CPUS-$(grep -c ^processor /proc/cpuinfo)-END`)
			c.Expect(t, from, "PIN-CPUS-"+tc.guestSeesProcess+"-END", time.Minute)
		})
	}
	t.Run("too few CPUs", func(t *testing.T) {
		vmi := guestVMI(t)
		vmi.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: uint32(len(cpus)), Cores: 1, Threads: 1, DedicatedCPUPlacement: true, IsolateEmulatorThread: true}
		v := newLauncher(t)
		_, err := v.client.Sync(context.Background(), testutil.SyncRequest(t, vmi, nil))
		var apiErr *launcher.APIError
		want := fmt.Sprintf("needs %d host CPUs of its own", len(cpus)+1)
		if !errors.As(err, &apiErr) || apiErr.Field != "machine.cpu.dedicatedCPUs" || !strings.Contains(apiErr.Msg, want) {
			t.Fatalf("sync: %v (field %q), want a refusal at machine.cpu.dedicatedCPUs saying %q", err, fieldOf(apiErr), want)
		}
		if st, err := v.client.Status(context.Background()); err != nil || (st.Exit == nil && st.PID != 0) {
			t.Errorf("after the refusal: %+v, %v; want no QEMU running", st, err)
		}
	})
}

// qemuThreadCPUs reads the CPUs each of QEMU's threads may run on (Cpus_allowed_list), split into
// the vCPU threads (named "CPU N/TCG" with debug-threads) and the others, by thread name and ID.
func qemuThreadCPUs(t *testing.T, pid int) (vcpus, others map[string]string) {
	t.Helper()
	threads, err := testutil.Threads(pid)
	if err != nil {
		t.Fatal(err)
	}
	vcpus, others = map[string]string{}, map[string]string{}
	for _, th := range threads {
		if strings.HasPrefix(th.Name, "CPU ") {
			vcpus[th.Name] = canonicalCPUList(th.CPUs)
		} else {
			others[th.Name+"/"+th.TID] = th.CPUs
		}
	}
	return vcpus, others
}

// canonicalCPUList turns the kernel's list (0-1,3) into single CPUs (0,1,3).
func canonicalCPUList(l string) string {
	var out []string
	for _, part := range strings.Split(l, ",") {
		lo, hi, found := strings.Cut(part, "-")
		a, _ := strconv.Atoi(lo)
		b := a
		if found {
			b, _ = strconv.Atoi(hi)
		}
		for c := a; c <= b; c++ {
			out = append(out, strconv.Itoa(c))
		}
	}
	return strings.Join(out, ",")
}
