// Package cpumanager reads the kubelet's CPU manager checkpoint: its policy, for the node's
// cpumanager label, and the CPUs its static policy gave a pod's container for itself, which
// real-time vCPUs are held to.
package cpumanager

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/utils/cpuset"
)

// StateFile is where the kubelet keeps its CPU manager's state (its root directory's
// cpu_manager_state), whatever the policy; the node agent's DaemonSet mounts the directory
// read-only.
const StateFile = "/var/lib/kubelet/cpu_manager_state"

// State is the checkpoint: the policy, the shared pool (defaultCpuSet) and, under the static
// policy, the CPUs of each container that has some of its own (entries: pod UID → container →
// CPU list).
type State struct {
	PolicyName    string                       `json:"policyName"`
	DefaultCPUSet string                       `json:"defaultCpuSet"`
	Entries       map[string]map[string]string `json:"entries"`
}

// Read reads the checkpoint at path.
func Read(path string) (State, error) {
	var st State
	data, err := os.ReadFile(path)
	if err != nil {
		return st, fmt.Errorf("read the kubelet's CPU manager state: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("%s is no CPU manager checkpoint: %w", path, err)
	}
	if st.PolicyName == "" {
		return st, fmt.Errorf("%s is no CPU manager checkpoint: it names no policyName", path)
	}
	return st, nil
}

// Exclusive is the CPUs the static policy gave container of pod podUID for itself; an error when
// it gave none.
func (s State) Exclusive(podUID, container string) (cpuset.CPUSet, error) {
	list := s.Entries[podUID][container]
	if s.PolicyName != "static" || list == "" {
		return cpuset.CPUSet{}, fmt.Errorf("the kubelet's CPU manager (policy %q) gave container %s of pod %s no CPUs of its own", s.PolicyName, container, podUID)
	}
	set, err := cpuset.Parse(list)
	if err != nil {
		return cpuset.CPUSet{}, fmt.Errorf("the CPU manager's CPUs for container %s of pod %s: %w", container, podUID, err)
	}
	return set, nil
}
