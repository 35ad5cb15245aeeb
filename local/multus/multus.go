// Package multus builds Multus CNI's thin plugin and writes its configuration, for local mode's
// nodes: the virtual nodes' provider runs it for pods with secondary networks, real nodes'
// containerd for every pod.
package multus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/qvirt/qvirt/local/gobuild"
)

// Version is the Multus CNI release Build builds: its thin plugin, the one binary that reads a
// pod's network annotations and runs the NetworkAttachmentDefinitions' CNI configurations besides
// the cluster's network.
const Version = "v4.2.2"

const module = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4"

// Build builds Multus's thin plugin (Version) with the go command into
// cacheRoot/multus-<version>, unless it is there already, and returns that directory for
// provider.Options.MultusBinDir and kubenode.Options.MultusBin (local/gobuild).
func Build(ctx context.Context, cacheRoot string) (string, error) {
	dir := filepath.Join(cacheRoot, "multus-"+Version)
	if _, err := os.Stat(filepath.Join(dir, "multus")); err == nil {
		return dir, nil
	}
	// Built into a temporary name and renamed, so a build cut short leaves no binary behind.
	tmp := filepath.Join(dir, fmt.Sprintf(".multus-%d.tmp", os.Getpid()))
	if err := gobuild.Build(ctx, module, Version, tmp, []string{"-ldflags", "-s -w"}, module+"/cmd/multus"); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "multus")); err != nil {
		return "", fmt.Errorf("install multus: %w", err)
	}
	return dir, nil
}

// Options are what a node's Multus needs.
type Options struct {
	// Kubeconfig is the file Multus reads pods and NetworkAttachmentDefinitions and writes pods'
	// network-status annotations with.
	Kubeconfig string
	// StateDir holds Multus's cache of the delegates it ran (which DEL needs).
	StateDir string
	// LogFile is Multus's log (errors only).
	LogFile string
	// CNIBinDir holds the plugins the delegates name.
	CNIBinDir string
}

// Config is a node's Multus network list named name: the thin plugin, with cluster (a CNI
// network list, as JSON would decode it) as the pod's default network. namespaceIsolation keeps
// a pod to the NetworkAttachmentDefinitions of its own namespace (and of "default", Multus's
// global namespace), so that one tenant cannot attach to another's network.
func Config(name string, o Options, cluster map[string]any) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       name,
		"plugins": []any{map[string]any{
			"type":               "multus",
			"kubeconfig":         o.Kubeconfig,
			"cniDir":             filepath.Join(o.StateDir, "cache"),
			"binDir":             o.CNIBinDir,
			"confDir":            filepath.Join(o.StateDir, "net.d"),
			"namespaceIsolation": true,
			"logFile":            o.LogFile,
			"logLevel":           "error",
			// Keep the cache when a delegate's DEL fails, so that a later DEL can release
			// what it holds.
			"retryDeleteOnError": true,
			"delegates":          []any{cluster},
		}},
	}
}
