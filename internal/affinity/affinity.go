// Package affinity reads the kernel's CPU affinity masks, for the launcher (pinning QEMU's threads)
// and the node agent (checking a thread before it turns real-time) alike.
package affinity

import "golang.org/x/sys/unix"

// CPUs lists the CPUs set in set, in order.
func CPUs(set *unix.CPUSet) []int {
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}
