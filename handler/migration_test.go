package handler_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
)

// testPKI is a CA issuing leaves as the certificate controller does.
type testPKI struct{ ca *certs.Pair }

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca}
}

func (p *testPKI) material(t *testing.T, spec certs.LeafSpec) *certs.Material {
	t.Helper()
	now := time.Now()
	leaf, err := p.ca.Issue(spec, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	data, err := certs.MaterialData(leaf, []*x509.Certificate{p.ca.Cert})
	if err != nil {
		t.Fatal(err)
	}
	m, err := certs.ParseMaterial(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestStrayMigrationConnections connects to a migration target from outside while it waits for
// the guest (the source node's agent is stopped meanwhile) and sends garbage: to the target pod's
// old migration port in the clear, and to the target node's migration endpoint over TLS without a
// client certificate, with qvirt-api's certificate (same CA, not a node agent), with the source
// node agent's certificate naming another migration, and with valid certificates of node agents
// of other nodes than the source naming this migration, or its disk streams (block migration). None
// may reach the incoming QEMU: the real migration afterwards succeeds and the guest goes on
// counting.
func TestStrayMigrationConnections(t *testing.T) {
	e := newEnv(t)
	nodeB := e.addNode()
	v, _, srcCon := e.startGuest("stray")
	srcCon.Expect(t, 0, "tick 2\r\n", bootTimeout)

	e.killHandler() // the source waits until the strays are done
	vmim, target := e.startMigration(v, "stray-1", nodeB)
	ready := e.waitVMI("stray", time.Minute, "target ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && ms.TargetReady && ms.TargetNodeAddress != ""
	})
	addr := ready.Status.MigrationState.TargetNodeAddress
	garbage := []byte(strings.Repeat("QEVM\x00\x00\x00\x03garbage", 64))

	if c, err := net.DialTimeout("tcp", net.JoinHostPort(target.net.PodIP.String(), "49152"), 2*time.Second); err == nil {
		_, _ = c.Write(garbage)
		_ = c.Close()
		t.Errorf("the target pod accepts plain TCP on the old migration port")
	}
	api := e.pki.material(t, certs.APISpec)
	source := e.pki.material(t, certs.HandlerNodeSpec(e.node))
	otherNode := e.pki.material(t, certs.HandlerNodeSpec("node-elsewhere"))
	targetAgent := e.pki.material(t, certs.HandlerNodeSpec(nodeB.node))
	uid := string(ready.Status.MigrationState.MigrationUID) + "\n"
	disks := string(ready.Status.MigrationState.MigrationUID) + " disks\n"
	for _, tc := range []struct {
		name   string
		cert   *certs.Material
		header string
	}{
		{"no client certificate", nil, uid},
		{"qvirt-api's certificate", api, uid},
		{"the source node agent's certificate, another migration", source, "00000000-0000-0000-0000-000000000000\n"},
		{"another node's agent, this migration", otherNode, uid},
		{"the target node's own agent, this migration", targetAgent, uid},
		{"another node's agent, this migration's disks", otherNode, disks},
		{"the source node agent's certificate, disks of a migration that copies none", source, disks},
	} {
		if fed := strayTLS(t, addr, tc.cert, tc.header, garbage); fed {
			t.Errorf("%s: the target accepted the garbage and kept the connection open", tc.name)
		}
	}
	if got := e.get("stray").Status.MigrationState; got.Failed {
		t.Fatalf("a stray connection failed the migration: %s", got.FailureReason)
	}

	e.startHandler()
	dstCon := nodeB.console(v)
	e.waitMigrationSucceeded(vmim)
	last := srcCon.LastTick()
	dstCon.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), 30*time.Second)
}

// strayTLS dials addr over TLS presenting cert (none when nil), sends header and garbage, and
// reports whether the server took it all and kept the connection open for more.
func strayTLS(t *testing.T, addr string, cert *certs.Material, header string, garbage []byte) bool {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the stray does not care who serves
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.Certificate}
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append([]byte(header), garbage...)); err != nil {
		return false
	}
	// A refused stream is closed by the server: the read ends with EOF or a TLS alert.
	_, err = io.ReadAll(c)
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
