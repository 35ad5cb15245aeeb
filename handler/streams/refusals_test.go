package streams_test

import (
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/streams"
)

// TestRefusals checks every way in which a request is turned away before it reaches a VM; none of
// these VMIs has a launcher.
func TestRefusals(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, t.TempDir(), p, nil)
	here := createVMI(t, "refusals-here", nil)
	elsewhere := createVMI(t, "refusals-elsewhere", func(v *v1alpha1.VirtualMachineInstance) { v.Status.NodeName = "node-b" })
	scheduled := createVMI(t, "refusals-scheduled", func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.Scheduled })
	headless := createVMI(t, "refusals-headless", func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
	})
	unknown := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-vmi"}}

	t.Run("a client without a certificate is refused at the TLS layer", func(t *testing.T) {
		_, _, err := srv.do(t, http.MethodPut, pathOf(here, streams.Pause), alice, nil)
		if err == nil || !strings.Contains(err.Error(), "tls") {
			t.Fatalf("without a client certificate: %v, want a TLS error", err)
		}
	})

	t.Run("a certificate from another CA is refused at the TLS layer", func(t *testing.T) {
		_, _, err := srv.do(t, http.MethodPut, pathOf(here, streams.Pause), alice, &p.otherClient.tls)
		if err == nil || !strings.Contains(err.Error(), "tls") {
			t.Fatalf("with another CA's certificate: %v, want a TLS error", err)
		}
	})

	t.Run("AllowedClientNames refuses other names from the right CA", func(t *testing.T) {
		strict := startServer(t, t.TempDir(), p, func(o *streams.Options) { o.AllowedClientNames = []string{"qvirt-api"} })
		intruder := p.ca.issue(t, "some-workload", false)
		if _, _, err := strict.do(t, http.MethodPut, pathOf(unknown, streams.Pause), alice, &intruder.tls); err == nil || !strings.Contains(err.Error(), "tls") {
			t.Fatalf("certificate CN=some-workload: %v, want a TLS error", err)
		}
		if code, _, err := strict.do(t, http.MethodPut, pathOf(unknown, streams.Pause), alice, &p.client.tls); err != nil || code != http.StatusNotFound {
			t.Fatalf("certificate CN=qvirt-api: %d %v, want 404 for the unknown VMI", code, err)
		}
	})

	for _, tc := range []struct {
		name     string
		method   string
		path     string
		who      caller
		code     int
		reason   metav1.StatusReason
		contains []string
	}{
		{"unknown VMI", http.MethodPut, pathOf(unknown, streams.Pause), alice, 404, metav1.StatusReasonNotFound, []string{"no-such-vmi"}},
		{"unknown VMI console", http.MethodGet, pathOf(unknown, streams.Console), alice, 404, metav1.StatusReasonNotFound, []string{"no-such-vmi"}},
		{"VMI on another node", http.MethodPut, pathOf(elsewhere, streams.Pause), alice, 409, metav1.StatusReasonConflict, []string{`"node-b"`, nodeName}},
		{"VMI not running", http.MethodGet, pathOf(scheduled, streams.QMP), alice, 409, metav1.StatusReasonConflict, []string{"Scheduled, not Running"}},
		{"VMI without graphics", http.MethodGet, pathOf(headless, streams.VNC), alice, 400, metav1.StatusReasonBadRequest, []string{"no graphics device"}},
		{"console socket missing", http.MethodGet, pathOf(here, streams.Console), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"serial console socket", "missing"}},
		{"QMP socket missing", http.MethodGet, pathOf(here, streams.QMP), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"QMP shell socket", "missing"}},
		{"launcher missing", http.MethodPut, pathOf(here, streams.Unpause), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"launcher socket", "missing"}},
		{"launcher missing for a soft reboot", http.MethodPut, pathOf(here, streams.SoftReboot), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"launcher socket", "missing"}},
		{"launcher missing for a screenshot", http.MethodGet, pathOf(here, streams.Screenshot), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"launcher socket", "missing"}},
		{"launcher missing for guestosinfo", http.MethodGet, pathOf(here, streams.GuestOSInfo), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"launcher socket", "missing"}},
		{"launcher missing for a freeze", http.MethodPut, pathOf(here, streams.Freeze), alice, 503, metav1.StatusReasonServiceUnavailable, []string{"launcher socket", "missing"}},
		{"userlist of a VMI on another node", http.MethodGet, pathOf(elsewhere, streams.UserList), alice, 409, metav1.StatusReasonConflict, []string{`"node-b"`}},
		{"screenshot without graphics", http.MethodGet, pathOf(headless, streams.Screenshot), alice, 400, metav1.StatusReasonBadRequest,
			[]string{"no graphics device", "spec.domain.devices.autoattachGraphicsDevice"}},
		{"no user header", http.MethodPut, pathOf(here, streams.Pause), caller{}, 400, metav1.StatusReasonBadRequest, []string{streams.HeaderUser}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, st, err := srv.do(t, tc.method, tc.path, tc.who, &p.client.tls)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || st.Code != int32(tc.code) || st.Reason != tc.reason || st.Kind != "Status" {
				t.Fatalf("%s %s: HTTP %d %+v, want %d %s", tc.method, tc.path, code, st, tc.code, tc.reason)
			}
			for _, want := range tc.contains {
				if !strings.Contains(st.Message, want) {
					t.Errorf("message %q does not mention %q", st.Message, want)
				}
			}
		})
	}

	t.Run("a websocket offering only another subprotocol is refused", func(t *testing.T) {
		_, resp, err := srv.dial(t, here, streams.Console, alice, "v4.channel.k8s.io")
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(body(resp), streams.SubprotocolPlain) {
			t.Fatalf("wrong subprotocol: %v %s, want 400 naming %s", err, body(resp), streams.SubprotocolPlain)
		}
	})
}

// TestCertificateReload rotates the serving certificate on disk and sees the next connection get
// the new one, without restarting the server.
func TestCertificateReload(t *testing.T) {
	p := newPKI(t)
	srv := startServer(t, t.TempDir(), p, nil)
	unknown := pathOf(&v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nope"}}, streams.Pause)
	servedSerial := func() string {
		req, _ := http.NewRequest(http.MethodPut, srv.base+unknown, nil)
		req.Header = alice.header()
		resp, err := p.httpClient(&p.client.tls).Do(req)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		defer resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	before := servedSerial()
	if want := leafSerial(t, p.server); before != want {
		t.Fatalf("served certificate serial %s, want %s", before, want)
	}
	rotated := p.ca.issue(t, "qvirt-handler-rotated", true)
	time.Sleep(10 * time.Millisecond) // a different modification time even on coarse clocks
	p.writeServer(t, rotated)
	if got, want := servedSerial(), leafSerial(t, rotated); got != want {
		t.Fatalf("after rotation the server presents serial %s, want the new %s", got, want)
	}
}

func leafSerial(t *testing.T, c issued) string {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.tls.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber.String()
}
