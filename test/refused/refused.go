// Package refused holds manifests this version of qvirt refuses at admission: KubeVirt-shaped ones
// that use what it does not realise (v1alpha1.NotRealised), and ones that used to pass admission
// and fail only in the launcher. Each names the fields it is refused at in "# refused at: PATH"
// comment lines. This package's test runs the webhook's validators and run mode's manifest loader on
// each; controllers/admission's test sends each through kube-apiserver to the webhook.
package refused

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Manifest is one refused manifest.
type Manifest struct {
	// File is the manifest's absolute path.
	File string
	Data []byte
	// Fields are the paths of its "# refused at:" lines, in order.
	Fields []string
}

const marker = "# refused at:"

// Dir is the directory holding the manifests (this package's own).
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Load reads every *.yaml in Dir. A manifest that names no field is an error.
func Load() ([]Manifest, error) {
	files, err := filepath.Glob(filepath.Join(Dir(), "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		m := Manifest{File: f, Data: data}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, marker); ok {
				m.Fields = append(m.Fields, strings.TrimSpace(rest))
			}
		}
		if len(m.Fields) == 0 {
			return nil, fmt.Errorf("%s names no field in a %q line", filepath.Base(f), marker)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no manifests in %s", Dir())
	}
	return out, nil
}
