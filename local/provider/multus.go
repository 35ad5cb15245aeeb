package provider

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/local/multus"
)

// Multus's pod annotations: a pod that carries either is attached through Multus.
var multusAnnotations = []string{"k8s.v1.cni.cncf.io/networks", "v1.multus-cni.io/default-network"}

// Names inside a node's state directory for Multus.
const (
	multusDir     = "multus"      // Multus's own cache of the delegates it ran, which DEL needs
	multusPodsDir = "multus-pods" // one empty file per pod attached through Multus, named by UID
)

// usesMultus says whether pod asks for Multus's networks.
func usesMultus(pod *corev1.Pod) bool {
	for _, a := range multusAnnotations {
		if pod.Annotations[a] != "" {
			return true
		}
	}
	return false
}

// multusConf is the node's Multus configuration (multus.Config) with the node's pod network as
// the cluster's default network.
func multusConf(opts Options, pod *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	var cluster map[string]any
	if err := json.Unmarshal(pod.Bytes, &cluster); err != nil {
		return nil, fmt.Errorf("multus config: the pod network's: %w", err)
	}
	conf, err := json.Marshal(multus.Config("qvirt-multus-"+opts.NodeName, multus.Options{Kubeconfig: opts.MultusKubeconfig,
		StateDir: filepath.Join(opts.StateDir, multusDir), CNIBinDir: opts.CNIBinDir,
		LogFile: filepath.Join(opts.StateDir, logsDir, "multus.log")}, cluster))
	if err != nil {
		return nil, fmt.Errorf("multus config: %w", err)
	}
	return libcni.ConfListFromBytes(conf)
}

// podArgs are the CNI_ARGS a kubelet's runtime passes, by which Multus finds the pod.
func podArgs(pod *corev1.Pod) [][2]string {
	return [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", string(pod.UID)}, {"K8S_POD_UID", string(pod.UID)}}
}
