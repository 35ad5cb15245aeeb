package launcher

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// KubeVirt's guest NUMA mapping (domain.cpu.numa.guestMappingPassthrough): a guest NUMA node for
// each host NUMA node of the vCPUs' dedicated CPUs, holding those vCPUs and its share of the RAM,
// bound to that host node. Binding a node's RAM is QEMU's host-nodes/policy=bind, an mbind(2),
// which the runtime's default seccomp profile refuses a container without CAP_SYS_NICE, and the
// launcher holds none. So the launcher takes the case it can do without one: the container's CPUs
// on a single host node (what the kubelet's topology manager gives a Guaranteed pod under its
// single-numa-node policy, and every node with one NUMA node). The guest then has one NUMA node
// with every vCPU and all the RAM, and the kernel allocates the RAM on the host node whose CPUs
// touch it first, within the container's cpuset.mems. CPUs on several host nodes fail the start,
// naming the field.

// guestNUMA: one guest NUMA node holding every vCPU and the guest's RAM backend.
func (b *builder) guestNUMA() {
	m := b.m
	if !m.CPU.NUMAPassthrough {
		return
	}
	p := machinePath.Child("cpu", "numaPassthrough")
	switch {
	case !m.CPU.DedicatedCPUs:
		b.fail(machine.Invalid(p, true, "needs dedicatedCPUs: the guest's NUMA nodes are those of its vCPUs' host CPUs"))
	case m.HugePageKiB == 0:
		b.fail(machine.Invalid(p, true, "needs hugePageKiB, as KubeVirt's guestMappingPassthrough needs huge pages"))
	case m.MemoryHotplugRoomMiB() > 0:
		b.fail(machine.Invalid(p, true, "cannot go with memory hotplug room (maxMemoryMiB)"))
	}
	b.add("-numa", fmt.Sprintf("node,nodeid=0,cpus=0-%d,memdev=%s", m.CPU.VCPUs-1, GuestRAMID))
}

// sysNodeDir is where the kernel lists the host's NUMA nodes.
var sysNodeDir = "/sys/devices/system/node"

// checkOneHostNode fails unless every one of cpus is on the same host NUMA node.
func checkOneHostNode(cpus []int) error {
	nodes, err := hostNodesOf(cpus)
	if err != nil {
		return fmt.Errorf("the host NUMA nodes of CPUs %s: %w", formatCPUs(cpus), err)
	}
	if len(nodes) != 1 {
		return machine.Invalid(machinePath.Child("cpu", "numaPassthrough"), true, fmt.Sprintf(
			"the vCPUs' CPUs are on host NUMA nodes %v (node: CPUs): binding each guest node's memory to its host node needs mbind(2), which the pod's seccomp profile refuses without CAP_SYS_NICE; give the kubelet's topology manager the single-numa-node policy",
			nodes))
	}
	return nil
}

// hostNodesOf maps each host NUMA node holding one of cpus to those CPUs. A kernel without NUMA
// (no node directory) has them all on node 0.
func hostNodesOf(cpus []int) (map[int][]int, error) {
	dirs, err := filepath.Glob(filepath.Join(sysNodeDir, "node[0-9]*"))
	if err != nil || len(dirs) == 0 {
		return map[int][]int{0: cpus}, nil
	}
	want := map[int]bool{}
	for _, c := range cpus {
		want[c] = true
	}
	nodes := map[int][]int{}
	for _, d := range dirs {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "node"))
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(d, "cpulist"))
		if err != nil {
			return nil, err
		}
		list, err := parseCPUList(strings.TrimSpace(string(data)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(d, "cpulist"), err)
		}
		for _, c := range list {
			if want[c] {
				nodes[n] = append(nodes[n], c)
				delete(want, c)
			}
		}
	}
	if len(want) > 0 {
		return nil, fmt.Errorf("CPUs %v are on no NUMA node %s lists", slices.Sorted(maps.Keys(want)), sysNodeDir)
	}
	return nodes, nil
}

// parseCPUList reads the kernel's CPU list format ("0-3,6"; empty for none).
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		from, err := strconv.Atoi(lo)
		to := from
		if err == nil && isRange {
			to, err = strconv.Atoi(hi)
		}
		if err != nil || from < 0 || to < from || to >= 1<<16 {
			return nil, fmt.Errorf("%q is not a CPU list", s)
		}
		for c := from; c <= to; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
