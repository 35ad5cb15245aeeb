package apiserver_test

import (
	"net/http"
	"strings"
	"testing"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Refusals before any stream opens: each a metav1.Status with the right code and a message that
// names the object and what is wrong.
func TestStreamRefusals(t *testing.T) {
	e := setup(t)
	edit := e.users["edit"]
	createNode(t, "node-bare", "")
	rogueNode := "node-rogue"
	podsDir := t.TempDir()
	createNode(t, rogueNode, startHandlerWithCert(t, e, rogueNode, podsDir, "rogue"))
	// Node victim's streams address points at a handler presenting node impostor's certificate:
	// valid, of the same CA, for another node (a compromised agent redirecting streams to itself).
	createNode(t, "node-victim", startHandlerWithCert(t, e, "node-victim", podsDir, e.pki.handlerCert(t, "node-impostor")))
	testVMI(t, "pending", "", v1alpha1.Pending)
	testVMI(t, "bare", "node-bare", v1alpha1.Running)
	testVMI(t, "rogue", rogueNode, v1alpha1.Running)
	testVMI(t, "victim", "node-victim", v1alpha1.Running)

	for _, tc := range []struct {
		name, vmi string
		code      int32
		want      []string
	}{
		{"unknown VMI", "nope", http.StatusNotFound, []string{`"nope" not found`}},
		{"VMI not running", "pending", http.StatusConflict, []string{"VMI pending is not running (phase Pending)"}},
		{"node without a stream server", "bare", http.StatusServiceUnavailable, []string{"node-bare", v1alpha1.NodeStreamsAddressAnnotation}},
		{"handler certificate with the wrong name", "rogue", http.StatusServiceUnavailable, []string{"qvirt-handler certificate", "not-the-handler"}},
		{"another node's handler certificate", "victim", http.StatusServiceUnavailable, []string{"refused the qvirt-handler", "VMI " + testNS + "/victim on node node-victim",
			"certificate is for node node-impostor, not for node node-victim", v1alpha1.NodeStreamsAddressAnnotation}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := dial(t, edit, tc.vmi, sub.Console, sub.SubprotocolPlain)
			if err == nil {
				t.Fatal("the console opened")
			}
			st := status(t, resp)
			t.Logf("%d %s", st.Code, st.Message)
			if st.Code != tc.code {
				t.Errorf("code %d, want %d (%s)", st.Code, tc.code, st.Message)
			}
			for _, w := range tc.want {
				if !strings.Contains(st.Message, w) {
					t.Errorf("message %q does not contain %q", st.Message, w)
				}
			}
		})
	}
}
