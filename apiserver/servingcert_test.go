package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/qvirt/qvirt/apiserver"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/test/testutil"
)

// qvirt-api serving with --tls-secret: no certificate (so no handshake) until the Secret
// exists, then its certificate, and after a rotation the new one from the next handshake, with
// no restart. kube-apiserver's check is reproduced: trust only the CA, name NAME.NAMESPACE.svc.
func TestServingCertificateFromSecretReloads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kubeconfig, err := serviceAccountKubeconfig(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	name := "serving-reload-test"
	src := certs.NewSource(cs, installNS, name)
	runCtx, stop := context.WithCancel(context.Background())
	srcDone := make(chan struct{})
	go func() { defer close(srcDone); _ = src.Start(runCtx) }()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := apiserver.NewOptions()
	opts.SecureServing.Listener = ln
	opts.SecureServing.BindAddress = net.IPv4(127, 0, 0, 1)
	opts.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	opts.Authentication.RemoteKubeConfigFile = kubeconfig
	opts.Authorization.RemoteKubeConfigFile = kubeconfig
	opts.Kubeconfig = kubeconfig
	opts.HandlerTLS = func() (*tls.Config, error) { return &tls.Config{MinVersion: tls.VersionTLS12}, nil }
	opts.ServingCert = apiserver.NewSecretServingCert(src)
	opts.Log = testr.New(t)
	api, err := apiserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	apiDone := make(chan struct{})
	go func() { defer close(apiDone); _ = api.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-srcDone
		select {
		case <-apiDone:
		case <-time.After(30 * time.Second):
			t.Error("qvirt-api did not stop within 30s")
		}
		_ = cs.CoreV1().Secrets(installNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	ca, err := certs.NewCA("test-ca", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	spec := certs.ServingSpec(certs.APIServiceName, installNS)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	presented := func() (*x509.Certificate, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", ln.Addr().String(),
			&tls.Config{RootCAs: roots, ServerName: spec.CommonName, MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0], nil
	}
	if got, err := presented(); err == nil {
		t.Fatalf("before the Secret exists qvirt-api presented %s", got.Subject.CommonName)
	}
	issue := func() (*certs.Pair, map[string][]byte) {
		leaf, err := ca.Issue(spec, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		data, err := certs.MaterialData(leaf, []*x509.Certificate{ca.Cert})
		if err != nil {
			t.Fatal(err)
		}
		return leaf, data
	}
	first, data := issue()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: installNS}, Type: corev1.SecretTypeTLS, Data: data}
	if sec, err = cs.CoreV1().Secrets(installNS).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last error
	testutil.Eventually(t, 30*time.Second, "qvirt-api to present the Secret's certificate", func() bool {
		got, err := presented()
		last = err
		return err == nil && got.Equal(first.Cert)
	}, func() string { return fmt.Sprint(last) })

	second, data := issue()
	sec.Data = data
	if _, err := cs.CoreV1().Secrets(installNS).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	testutil.Eventually(t, 30*time.Second, "qvirt-api to present the rotated certificate", func() bool {
		got, err := presented()
		return err == nil && got.Equal(second.Cert)
	})
	t.Logf("rotated certificate served %.2fs after the Secret's update", time.Since(rotated).Seconds())
}
