// Package buildinfo reads the version Go embeds in a binary (module version, VCS revision and
// whether the tree was modified) for qvirt-api's GET .../version and `qvirtctl version`. It
// imports nothing of Kubernetes' server libraries, so qvirtctl can use it and stay small.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// devel is the version of a binary built without a module version (go build in the repository).
const devel = "devel"

// Version is this binary's version. A binary without build information (a test binary run in a
// way that strips it) still says devel, its Go version and platform.
func Version() subv1.Version {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi)
}

// fromBuildInfo is the version bi describes; bi may be nil. GitCommit is the VCS revision, with
// -dirty appended when the build had uncommitted changes, so that a binary from a modified tree
// is never taken for the commit it started from.
func fromBuildInfo(bi *debug.BuildInfo) subv1.Version {
	v := subv1.Version{GitVersion: devel, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.GitVersion = bi.Main.Version
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.GitCommit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && v.GitCommit != "" {
		v.GitCommit += "-dirty"
	}
	return v
}
