package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

func TestFromBuildInfo(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	base := subv1.Version{GitVersion: "devel", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	with := func(f func(*subv1.Version)) subv1.Version { v := base; f(&v); return v }
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want subv1.Version
	}{
		{"no build information", nil, base},
		{"go build in the repository", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, base},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}},
			with(func(v *subv1.Version) { v.GitVersion = "v0.3.0" })},
		{"clean tree", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}},
			with(func(v *subv1.Version) { v.GitCommit = rev })},
		{"modified tree", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}},
			with(func(v *subv1.Version) { v.GitCommit = rev + "-dirty" })},
		{"modified listed before the revision", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}, {Key: "vcs.revision", Value: rev}}},
			with(func(v *subv1.Version) { v.GitCommit = rev + "-dirty" })},
		{"modified without a revision", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}}, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The test binary carries real build information: Version must at least name this Go and platform.
func TestVersionOfThisBinary(t *testing.T) {
	v := Version()
	if v.GoVersion != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH || v.GitVersion == "" {
		t.Errorf("Version() = %+v", v)
	}
}
