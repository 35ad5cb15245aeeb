package provider

import (
	"context"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeProvider is the node side: the node is as healthy as this process, so Ping always answers
// and the status never changes after registration (virtual-kubelet renews the heartbeat and lease).
type nodeProvider struct{}

func (nodeProvider) Ping(context.Context) error                           { return nil }
func (nodeProvider) NotifyNodeStatus(context.Context, func(*corev1.Node)) {}

// nodeObject is the Node the node controller registers. Its only address is the bridge's
// InternalIP: a Hostname address would make the apiserver resolve the name.
func nodeObject(opts Options, addr netip.Addr) *corev1.Node {
	labels := map[string]string{
		corev1.LabelHostname:   opts.NodeName,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: runtime.GOARCH,
		"type":                 "virtual-kubelet",
	}
	maps.Copy(labels, opts.Labels)
	capacity := nodeCapacity(opts)
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: opts.NodeName, Labels: labels},
		Spec:       corev1.NodeSpec{PodCIDR: opts.PodCIDR, PodCIDRs: []string{opts.PodCIDR}},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeReady, corev1.ConditionTrue, "ProviderReady"),
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "ProviderHasSufficientMemory"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "ProviderHasNoDiskPressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "ProviderHasSufficientPID"),
				cond(corev1.NodeNetworkUnavailable, corev1.ConditionFalse, "BridgeUp"),
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem:         "linux",
				Architecture:            runtime.GOARCH,
				KubeletVersion:          "v1.37.2-qvirt-local",
				ContainerRuntimeVersion: "qvirt-local://processes",
			},
		},
	}
}

// nodeCapacity is the node's capacity (and allocatable): the defaults with Options.Capacity over them.
func nodeCapacity(opts Options) corev1.ResourceList {
	capacity := defaultCapacity()
	maps.Copy(capacity, opts.Capacity)
	return capacity
}

func defaultCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(hostMemory(), resource.BinarySI),
		corev1.ResourcePods:   resource.MustParse("110"),
		ResourceKVM:           *resource.NewQuantity(DefaultDeviceCapacity, resource.DecimalSI),
		ResourceTun:           *resource.NewQuantity(DefaultDeviceCapacity, resource.DecimalSI),
	}
}

// hostMemory is MemTotal from /proc/meminfo in bytes, or 0 if unreadable.
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}
