package apiserver_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
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

	addr := startServingTest(t, kubeconfig, func(o *apiserver.Options) { o.ServingCert = apiserver.NewSecretServingCert(src) })
	t.Cleanup(func() {
		stop()
		<-srcDone
		_ = cs.CoreV1().Secrets(installNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	ca, err := certs.NewCA("test-ca", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	spec := certs.ServingSpec(certs.APIServiceName, installNS)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	presented := func() (*x509.Certificate, error) { return presentedBy(addr, roots, spec.CommonName) }
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

// startServingTest runs a qvirt-api on 127.0.0.1 (not registered with the aggregator) with
// set's serving options until the test ends, and returns its address.
func startServingTest(t *testing.T, kubeconfig string, set func(*apiserver.Options)) string {
	t.Helper()
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
	opts.Log = testr.New(t)
	set(opts)
	api, err := apiserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = api.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("qvirt-api did not stop within 30s")
		}
	})
	return ln.Addr().String()
}

// presentedBy is the certificate the server at addr presents to a client trusting roots only
// and checking name, as kube-apiserver's aggregator does.
func presentedBy(addr string, roots *x509.CertPool, name string) (*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

// As config/api mounts Secret qvirt-api-serving (--tls-cert-file, --tls-private-key-file): the
// kubelet updates a Secret volume by writing a new timestamped directory and swapping the ..data
// link the files point through; qvirt-api serves the new certificate without a restart.
func TestServingCertificateFromMountedSecretReloads(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kubeconfig, err := serviceAccountKubeconfig(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := certs.NewCA("test-ca", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	spec := certs.ServingSpec(certs.APIServiceName, installNS)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	vol := filepath.Join(dir, "api-serving")
	generation := 0
	write := func() *certs.Pair {
		leaf, err := ca.Issue(spec, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := kubeletWrite(vol, &generation, leaf); err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	first := write()
	addr := startServingTest(t, kubeconfig, func(o *apiserver.Options) {
		o.SecureServing.ServerCert.CertKey.CertFile = filepath.Join(vol, "tls.crt")
		o.SecureServing.ServerCert.CertKey.KeyFile = filepath.Join(vol, "tls.key")
	})
	testutil.Eventually(t, 30*time.Second, "qvirt-api to present the mounted certificate", func() bool {
		got, err := presentedBy(addr, roots, spec.CommonName)
		return err == nil && got.Equal(first.Cert)
	})
	second := write()
	rotated := time.Now()
	testutil.Eventually(t, 90*time.Second, "qvirt-api to present the rotated mounted certificate", func() bool {
		got, err := presentedBy(addr, roots, spec.CommonName)
		return err == nil && got.Equal(second.Cert)
	})
	t.Logf("rotated mounted certificate served %.2fs after the volume's update", time.Since(rotated).Seconds())
}

// kubeletWrite lays leaf out as the kubelet's atomic writer does in a Secret volume: the files
// tls.crt and tls.key are links to ..data/NAME, ..data links to a timestamped directory, and an
// update writes a new directory, swaps ..data by rename and removes the old one.
func kubeletWrite(vol string, generation *int, leaf *certs.Pair) error {
	*generation++
	ts := fmt.Sprintf("..gen_%d", *generation)
	if err := os.MkdirAll(filepath.Join(vol, ts), 0o755); err != nil {
		return err
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": leaf.CertPEM(), "tls.key": key} {
		if err := os.WriteFile(filepath.Join(vol, ts, name), data, 0o600); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(vol, "..data"))
	if err := os.Symlink(ts, filepath.Join(vol, "..data_tmp")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(vol, "..data_tmp"), filepath.Join(vol, "..data")); err != nil {
		return err
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(vol, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(vol, old))
	}
	return nil
}
