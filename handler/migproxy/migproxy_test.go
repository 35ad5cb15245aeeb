package migproxy_test

import (
	"context"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/migproxy"
)

// agentCerts is node's agent's certificate from ca, trusting ca.
func agentCerts(t *testing.T, ca *certs.Pair, node string) certs.Provider {
	t.Helper()
	now := time.Now()
	leaf, err := ca.Issue(certs.HandlerNodeSpec(node), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	data, err := certs.MaterialData(leaf, []*x509.Certificate{ca.Cert})
	if err != nil {
		t.Fatal(err)
	}
	m, err := certs.ParseMaterial(data)
	if err != nil {
		t.Fatal(err)
	}
	return certs.Fixed(m)
}

// fakeTarget is the target QEMU's incoming socket: it reports what each connection sent.
func fakeTarget(t *testing.T, socket string) <-chan string {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	got := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			data, _ := io.ReadAll(c)
			_ = c.Close()
			got <- string(data)
		}
	}()
	return got
}

// send plays the source QEMU: it connects to the tunnel's socket, sends payload and waits for
// the tunnel to close its side (it does once the stream ended or was refused).
func send(t *testing.T, socket, payload string) {
	t.Helper()
	if err := trySend(socket, payload); err != nil {
		t.Fatal(err)
	}
}

// trySend is send that returns the write's error: a tunnel that refuses the stream may close the
// source's connection before the payload is written (a broken pipe).
func trySend(socket, payload string) error {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, payload); err != nil {
		return err
	}
	_ = c.(*net.UnixConn).CloseWrite()
	_, _ = io.ReadAll(c)
	return nil
}

// The tunnel between node agents carries a migration only between the agents of its source and
// target nodes, though every agent's certificate is valid: a source refuses a target endpoint
// presenting another node's certificate, and a target refuses a stream from an agent of another
// node than the migration's source. Neither refusal uses up the migration's one stream.
func TestTunnelChecksBothNodes(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	incoming := filepath.Join(dir, "in.sock")
	got := fakeTarget(t, incoming)

	srv, err := migproxy.Listen("127.0.0.1:0", agentCerts(t, ca, "node-b"), testr.New(t).WithName("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	const uid = types.UID("3f1c2b4e-0000-4000-8000-000000000001")
	srv.Expect(uid, incoming, "node-a")

	forward := func(from, target, payload string, refused bool) {
		t.Helper()
		out := filepath.Join(dir, from+"-out.sock")
		tun := migproxy.NewTunnel(agentCerts(t, ca, from), testr.New(t).WithName(from))
		stop, err := tun.Forward(out, os.Getuid(), srv.Addr(), target, uid)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		if err := trySend(out, payload); err != nil && !refused {
			t.Fatal(err)
		}
	}
	// Node a's agent believes it sends to node c: node b's endpoint is refused by the source.
	forward("node-a", "node-c", "meant for node c", true)
	// Node c's agent sends to node b as if it were the source: refused by the target.
	forward("node-c", "node-b", "from an impostor", true)
	// The real source to the real target: the stream arrives, once.
	forward("node-a", "node-b", "the guest's state", false)

	select {
	case data := <-got:
		if data != "the guest's state" {
			t.Fatalf("the target QEMU received %q, want only the real source's stream", data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the real source's stream did not reach the target QEMU")
	}
	select {
	case data := <-got:
		t.Errorf("a second stream reached the target QEMU: %q", data)
	case <-time.After(200 * time.Millisecond):
	}
}

// A block migration's disk streams (the source QEMU's NBD connections) take the same tunnel with
// the same checks: the target accepts them from the migration's source node, to the NBD socket of
// a migration that copies disks, and no more once the memory stream has arrived.
func TestTunnelCarriesDiskStreams(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	incoming, nbd := filepath.Join(dir, "in.sock"), filepath.Join(dir, "nbd.sock")
	gotMemory, gotDisks := fakeTarget(t, incoming), fakeTarget(t, nbd)

	srv, err := migproxy.Listen("127.0.0.1:0", agentCerts(t, ca, "node-b"), testr.New(t).WithName("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	const uid = types.UID("3f1c2b4e-0000-4000-8000-000000000002")
	const diskless = types.UID("3f1c2b4e-0000-4000-8000-000000000003")
	srv.Expect(uid, incoming, "node-a")
	srv.ExpectDisks(uid, nbd)
	srv.Expect(diskless, incoming, "node-a")

	disks := func(from string, id types.UID, payloads ...string) {
		t.Helper()
		out := filepath.Join(dir, from+"-nbd.sock")
		stop, err := migproxy.NewTunnel(agentCerts(t, ca, from), testr.New(t).WithName(from)).ForwardDisks(out, os.Getuid(), srv.Addr(), "node-b", id)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		for _, p := range payloads {
			send(t, out, p)
		}
	}
	expect := func(got <-chan string, want ...string) {
		t.Helper()
		seen := map[string]bool{}
		for range want {
			select {
			case data := <-got:
				seen[data] = true
			case <-time.After(10 * time.Second):
				t.Fatalf("streams %q did not all arrive (saw %v)", want, seen)
			}
		}
		for _, w := range want {
			if !seen[w] {
				t.Errorf("stream %q did not arrive (saw %v)", w, seen)
			}
		}
	}
	none := func(got <-chan string, what string) {
		t.Helper()
		select {
		case data := <-got:
			t.Errorf("%s reached the target QEMU: %q", what, data)
		case <-time.After(200 * time.Millisecond):
		}
	}

	disks("node-c", uid, "disk from an impostor")
	disks("node-a", diskless, "disk of a migration without disks")
	none(gotDisks, "a refused disk stream")
	disks("node-a", uid, "disk one", "disk two")
	expect(gotDisks, "disk one", "disk two")

	out := filepath.Join(dir, "mem-out.sock")
	stop, err := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t)).Forward(out, os.Getuid(), srv.Addr(), "node-b", uid)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	send(t, out, "the guest's state")
	expect(gotMemory, "the guest's state")
	disks("node-a", uid, "disk after the switch")
	none(gotDisks, "a disk stream after the memory stream")
}
