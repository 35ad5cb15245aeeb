package apiserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// The group's discovery lists every subresource with the verb its RBAC rules use, kubectl
// api-resources shows the group, and the version endpoint answers any authenticated user.
func TestDiscoveryAndVersion(t *testing.T) {
	e := setup(t)
	code, data, _ := get(t, e.users["admin"], "/apis/"+sub.GroupVersion.String())
	if code != http.StatusOK {
		t.Fatalf("discovery: HTTP %d: %s", code, data)
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	verbs := map[string][]string{}
	for _, r := range list.APIResources {
		verbs[r.Name] = r.Verbs
	}
	for name, want := range map[string]string{
		"virtualmachineinstances/console": "get", "virtualmachineinstances/vnc": "get", "virtualmachineinstances/qmp": "get",
		"virtualmachineinstances/usbredir":   "get",
		"virtualmachineinstances/screenshot": "get", "virtualmachineinstances/pause": "update", "virtualmachineinstances/unpause": "update",
		"virtualmachineinstances/softreboot": "update", "virtualmachines/start": "update", "virtualmachines/stop": "update",
		"virtualmachines/restart": "update", "virtualmachines/migrate": "update", "virtualmachines/addvolume": "update",
		"virtualmachines/removevolume": "update", "virtualmachineinstances/guestosinfo": "get", "virtualmachineinstances/userlist": "get",
		"virtualmachineinstances/filesystemlist": "get", "virtualmachineinstances/freeze": "update", "virtualmachineinstances/unfreeze": "update",
	} {
		if !slices.Contains(verbs[name], want) {
			t.Errorf("discovery lists %s with verbs %v, want %s", name, verbs[name], want)
		}
	}

	// kubectl lists no resource of the group (they have no verbs of their own, only their
	// subresources), but discovery must not fail for it.
	out, errOut, err := cp.KubectlCmd(context.Background(), nil, "api-resources")
	if err != nil || strings.Contains(errOut, sub.GroupVersion.Group) {
		t.Errorf("kubectl api-resources: %v\n%s%s", err, out, errOut)
	}

	// The aggregator merges the group's OpenAPI documents (fetched in the background after the
	// APIService turns available, so give it a moment); both must build.
	for _, path := range []string{"/openapi/v2", "/openapi/v3/apis/" + sub.GroupVersion.String()} {
		var code int
		var data []byte
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, data, _ = get(t, e.users["admin"], path)
			if (code == http.StatusOK && strings.Contains(string(data), "subresources.qvirt.io")) || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if code != http.StatusOK || !strings.Contains(string(data), "subresources.qvirt.io") {
			t.Errorf("GET %s: HTTP %d: %.300s", path, code, data)
		}
	}

	code, data, _ = get(t, e.users["view"], sub.VersionPath())
	var v sub.Version
	if code != http.StatusOK || json.Unmarshal(data, &v) != nil || v.GoVersion == "" || v.Platform == "" {
		t.Errorf("version as the view user: HTTP %d: %s", code, data)
	}
}
