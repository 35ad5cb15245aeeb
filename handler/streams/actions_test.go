package streams_test

import (
	"bytes"
	"crypto/tls"
	"image/png"
	"io"
	"net/http"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/streams"
)

// getScreenshot fetches the VMI's screenshot over mutual TLS, checks that it is image/png and
// decodes, and returns its size.
func getScreenshot(t *testing.T, s *server, vmi *v1alpha1.VirtualMachineInstance, who caller, cert *tls.Certificate) (int, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.base+pathOf(vmi, streams.Screenshot), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = who.header()
	resp, err := s.pki.httpClient(cert).Do(req)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read screenshot: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/png" {
		t.Fatalf("screenshot: HTTP %d %s: %.300s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot does not decode as PNG (%d bytes): %v", len(data), err)
	}
	b := img.Bounds()
	t.Logf("screenshot: %dx%d, %d bytes", b.Dx(), b.Dy(), len(data))
	return b.Dx(), b.Dy()
}
