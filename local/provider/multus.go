package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
)

// MultusVersion is the Multus CNI release BuildMultus builds: its thin plugin, the one binary
// that reads a pod's network annotations and runs the NetworkAttachmentDefinitions' CNI
// configurations besides the cluster's network.
const MultusVersion = "v4.2.2"

const multusModule = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4"

// Multus's pod annotations: a pod that carries either is attached through Multus.
var multusAnnotations = []string{"k8s.v1.cni.cncf.io/networks", "v1.multus-cni.io/default-network"}

// Names inside a node's state directory for Multus.
const (
	multusDir     = "multus"      // Multus's own cache of the delegates it ran, which DEL needs
	multusPodsDir = "multus-pods" // one empty file per pod attached through Multus, named by UID
)

// BuildMultus builds Multus's thin plugin (MultusVersion) with the go command into
// cacheRoot/multus-<version>, unless it is there already, and returns that directory for
// Options.MultusBinDir. Like BuildCNIPlugins it builds in a throwaway module, so Multus's own
// dependencies resolve as upstream pinned them.
func BuildMultus(ctx context.Context, cacheRoot string) (string, error) {
	dir := filepath.Join(cacheRoot, "multus-"+MultusVersion)
	if _, err := os.Stat(filepath.Join(dir, "multus")); err == nil {
		return dir, nil
	}
	work, err := os.MkdirTemp("", "qvirt-multus-build-")
	if err != nil {
		return "", fmt.Errorf("multus build dir: %w", err)
	}
	defer os.RemoveAll(work)
	gomod := fmt.Sprintf("module qvirt.local/multus\n\ngo %s\n\nrequire %s %s\n",
		strings.TrimPrefix(runtime.Version(), "go"), multusModule, MultusVersion)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(gomod), 0o644); err != nil {
		return "", fmt.Errorf("multus build module: %w", err)
	}
	// Built into a temporary name and renamed, so a build cut short leaves no binary behind.
	tmp := filepath.Join(dir, ".multus.tmp")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, multusModule+"/cmd/multus")
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build multus %s: %w: %s", MultusVersion, err, out)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "multus")); err != nil {
		return "", fmt.Errorf("install multus: %w", err)
	}
	return dir, nil
}

// usesMultus says whether pod asks for Multus's networks.
func usesMultus(pod *corev1.Pod) bool {
	for _, a := range multusAnnotations {
		if pod.Annotations[a] != "" {
			return true
		}
	}
	return false
}

// multusConf is the node's Multus configuration: the thin plugin, with the node's pod network as
// the cluster's default network, reading pods and NetworkAttachmentDefinitions with kubeconfig.
// namespaceIsolation keeps a pod to the NetworkAttachmentDefinitions of its own namespace (and
// "default"), so that one tenant cannot attach to another's network.
func multusConf(opts Options, pod *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	var cluster map[string]any
	if err := json.Unmarshal(pod.Bytes, &cluster); err != nil {
		return nil, fmt.Errorf("multus config: the pod network's: %w", err)
	}
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "qvirt-multus-" + opts.NodeName,
		"plugins": []any{map[string]any{
			"type":               "multus",
			"kubeconfig":         opts.MultusKubeconfig,
			"cniDir":             filepath.Join(opts.StateDir, multusDir),
			"binDir":             opts.CNIBinDir,
			"confDir":            filepath.Join(opts.StateDir, multusDir, "net.d"),
			"namespaceIsolation": true,
			"logFile":            filepath.Join(opts.StateDir, multusDir, "multus.log"),
			"logLevel":           "error",
			"delegates":          []any{cluster},
		}},
	})
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
