package migproxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
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

// testCA is a CA for the nodes' agents, valid for the test.
func testCA(t *testing.T) *certs.Pair {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// endpoint is node-b's migration endpoint with its agent's certificate from ca, serving until
// the test ends.
func endpoint(t *testing.T, ca *certs.Pair) *migproxy.Server {
	t.Helper()
	srv, err := migproxy.Listen("127.0.0.1:0", agentCerts(t, ca, "node-b"), testr.New(t).WithName("node-b"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv
}

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

// arrives waits for the next stream the fake target got (fakeTarget) and checks that it is want.
func arrives(t *testing.T, got <-chan string, want, what string) {
	t.Helper()
	select {
	case data := <-got:
		if data != want {
			t.Fatalf("%s: the target received %q, want %q", what, data, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not reach the target", what)
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
	ca := testCA(t)
	dir := t.TempDir()
	incoming := filepath.Join(dir, "in.sock")
	got := fakeTarget(t, incoming)

	srv := endpoint(t, ca)
	const uid = types.UID("3f1c2b4e-0000-4000-8000-000000000001")
	srv.Expect(uid, incoming, "node-a", 1)

	forward := func(from, target, payload string, refused bool) {
		t.Helper()
		out := filepath.Join(dir, from+"-out.sock")
		tun := migproxy.NewTunnel(agentCerts(t, ca, from), testr.New(t).WithName(from))
		stop, err := tun.Forward(out, os.Getuid(), srv.Addr(), target, uid, 1)
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

	arrives(t, got, "the guest's state", "the real source's stream")
	select {
	case data := <-got:
		t.Errorf("a second stream reached the target QEMU: %q", data)
	case <-time.After(200 * time.Millisecond):
	}
}

// A post-copy migration whose link broke is resumed over the tunnel: once its stream was taken
// the endpoint refuses another (Expect again changes nothing), until the target listens again
// (ExpectRecovery); then one resumed stream from the source node gets through, and no more.
func TestTunnelCarriesAResumedPostCopy(t *testing.T) {
	ca := testCA(t)
	dir := t.TempDir()
	incoming := filepath.Join(dir, "in.sock")
	got := fakeTarget(t, incoming)
	srv := endpoint(t, ca)
	const uid = types.UID("3f1c2b4e-0000-4000-8000-0000000000aa")
	srv.Expect(uid, incoming, "node-a", 1)
	tun := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t).WithName("node-a"))
	out := filepath.Join(dir, "out.sock")
	forward := func(payload string) {
		t.Helper()
		stop, err := tun.Forward(out, os.Getuid(), srv.Addr(), "node-b", uid, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		_ = trySend(out, payload)
	}
	forward("the guest's state")
	arrives(t, got, "the guest's state", "the first stream")

	srv.Expect(uid, incoming, "node-a", 1)
	forward("a second stream")
	select {
	case data := <-got:
		t.Fatalf("a second stream of a taken migration reached the target: %q", data)
	case <-time.After(300 * time.Millisecond):
	}

	srv.ExpectRecovery(uid, incoming, "node-a")
	srv.ExpectRecovery(uid, incoming, "node-a") // repeated: still one stream
	forward("the rest of the pages")
	arrives(t, got, "the rest of the pages", "the resumed stream")
	forward("one more")
	select {
	case data := <-got:
		t.Errorf("a stream after the resumed one reached the target: %q", data)
	case <-time.After(300 * time.Millisecond):
	}
}

// A block migration's disk streams (the source QEMU's NBD connections) take the same tunnel with
// the same checks: the target accepts them from the migration's source node, to the NBD socket of
// a migration that copies disks, and no more once the memory stream has arrived.
func TestTunnelCarriesDiskStreams(t *testing.T) {
	ca := testCA(t)
	dir := t.TempDir()
	incoming, nbd := filepath.Join(dir, "in.sock"), filepath.Join(dir, "nbd.sock")
	gotMemory, gotDisks := fakeTarget(t, incoming), fakeTarget(t, nbd)

	srv := endpoint(t, ca)
	const uid = types.UID("3f1c2b4e-0000-4000-8000-000000000002")
	const diskless = types.UID("3f1c2b4e-0000-4000-8000-000000000003")
	srv.Expect(uid, incoming, "node-a", 2) // the main stream and a channel
	srv.ExpectDisks(uid, nbd)
	srv.Expect(diskless, incoming, "node-a", 1)

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
	stop, err := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t)).Forward(out, os.Getuid(), srv.Addr(), "node-b", uid, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	send(t, out, "the guest's state")
	expect(gotMemory, "the guest's state")
	disks("node-a", uid, "disk after the switch")
	none(gotDisks, "a disk stream after the memory stream")
	// A migration over parallel streams still waits for its channels after the main one; the
	// target's agent reconciling meanwhile does not open the disks again.
	srv.ExpectDisks(uid, nbd)
	disks("node-a", uid, "disk after the main stream, reopened")
	none(gotDisks, "a disk stream after the memory stream, the disks expected again")
}

// A migration over parallel streams (QEMU's multifd: the main stream, then one per channel)
// takes exactly that many connections through the tunnel, and the main one reaches the target
// QEMU first, even when a channel's connection gets to the target node before it: QEMU 7.2 takes
// the first connection it accepts for the main stream. A further stream, or a count raised by the
// target's agent reconciling again, gets nothing through.
func TestTunnelCarriesParallelStreams(t *testing.T) {
	ca := testCA(t)
	dir := t.TempDir()
	incoming := filepath.Join(dir, "in.sock")
	got := fakeTarget(t, incoming)
	srv := endpoint(t, ca)
	const uid = types.UID("3f1c2b4e-0000-4000-8000-000000000004")
	srv.Expect(uid, incoming, "node-a", 3)

	// A channel straight to the endpoint, as the source agent sends one, ahead of the main stream.
	early := make(chan error, 1)
	go func() {
		early <- sendStream(agentCerts(t, ca, "node-a"), srv.Addr(), string(uid)+" channel", "early channel")
	}()
	none := func(what string) {
		t.Helper()
		select {
		case data := <-got:
			t.Errorf("%s: %q reached the target QEMU", what, data)
		case <-time.After(300 * time.Millisecond):
		}
	}
	none("a channel before the main stream")

	out := filepath.Join(dir, "mem-out.sock")
	stop, err := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t)).Forward(out, os.Getuid(), srv.Addr(), "node-b", uid, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	go func() { _ = trySend(out, "main stream") }()
	for i, want := range []string{"main stream", "early channel"} {
		arrives(t, got, want, fmt.Sprintf("stream %d to reach the target QEMU", i))
	}
	if err := <-early; err != nil {
		t.Fatalf("the early channel: %v", err)
	}
	// The target's agent reconciles again with a higher count: the migration keeps its three.
	srv.Expect(uid, incoming, "node-a", 5)
	send(t, out, "channel two")
	if data := <-got; data != "channel two" {
		t.Fatalf("the last channel sent %q to the target QEMU", data)
	}
	_ = sendStream(agentCerts(t, ca, "node-a"), srv.Addr(), string(uid)+" channel", "a fourth stream")
	_ = sendStream(agentCerts(t, ca, "node-a"), srv.Addr(), string(uid), "a second main stream")
	none("a stream beyond the migration's three")
}

// sendStream plays a source agent's tunnel: it sends header and payload to the endpoint at addr
// (node-b's) and waits for the endpoint to close its side.
func sendStream(p certs.Provider, addr, header, payload string) error {
	cfg := certs.HandlerClientConfig(p, "node-b")
	cfg.NextProtos = []string{migproxy.Protocol}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, header+"\n"+payload); err != nil {
		return err
	}
	_ = c.CloseWrite()
	_, _ = io.ReadAll(c)
	return nil
}

// Cut ends a migration's streams under way: a source QEMU whose target stopped reading sees its
// connection closed (only then does a write blocked on a unix socket end), and streams of other
// migrations go on.
func TestCutEndsTheMigrationsStreams(t *testing.T) {
	ca := testCA(t)
	dir := t.TempDir()
	// A target QEMU that accepts and never reads.
	incoming := filepath.Join(dir, "in.sock")
	ln, err := net.Listen("unix", incoming)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	srv := endpoint(t, ca)
	const stuck, other = types.UID("3f1c2b4e-0000-4000-8000-000000000005"), types.UID("3f1c2b4e-0000-4000-8000-000000000006")
	srv.Expect(stuck, incoming, "node-a", 1)
	srv.Expect(other, incoming, "node-a", 1)
	tun := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t))

	// dial plays a source QEMU: it writes until its writes block (the tunnel's buffers full).
	dial := func(uid types.UID) (net.Conn, <-chan error) {
		out := filepath.Join(dir, string(uid)[30:]+".sock")
		stop, err := tun.Forward(out, os.Getuid(), srv.Addr(), "node-b", uid, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		c, err := net.DialTimeout("unix", out, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		ended := make(chan error, 1)
		go func() {
			chunk := make([]byte, 64<<10)
			for {
				if _, err := c.Write(chunk); err != nil {
					ended <- err
					return
				}
			}
		}()
		return c, ended
	}
	_, stuckEnded := dial(stuck)
	_, otherEnded := dial(other)
	select {
	case err := <-stuckEnded:
		t.Fatalf("the source's writes ended before the cut: %v", err)
	case <-time.After(time.Second):
	}
	tun.Cut(stuck)
	select {
	case err := <-stuckEnded:
		t.Logf("the stuck source's write ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the source QEMU's blocked write did not end after Cut")
	}
	// Nothing more of the cut migration goes through: its socket is gone, and the tunnel opens
	// no new one for it.
	if err := trySend(filepath.Join(dir, string(stuck)[30:]+".sock"), "a channel after the cut"); err == nil {
		t.Error("the cut migration's socket still took a stream")
	}
	if _, err := tun.Forward(filepath.Join(dir, "again.sock"), os.Getuid(), srv.Addr(), "node-b", stuck, 1); err == nil {
		t.Error("the tunnel listened again for a migration it cut")
	}
	select {
	case err := <-otherEnded:
		t.Fatalf("another migration's stream ended with the cut: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}

// A block migration's source QEMU connects its memory stream only once the copy of its disks is
// done, which may take far longer than the tunnel waits for a connection: the memory socket stays
// open while a disk stream is under way, and closes once nothing of the migration moved for the
// accept timeout.
func TestTunnelWaitsForTheMemoryWhileDisksCopy(t *testing.T) {
	ca := testCA(t)
	dir := t.TempDir()
	incoming, nbd := filepath.Join(dir, "in.sock"), filepath.Join(dir, "nbd.sock")
	gotMemory, gotDisks := fakeTarget(t, incoming), fakeTarget(t, nbd)
	srv := endpoint(t, ca)
	const uid, idle = types.UID("3f1c2b4e-0000-4000-8000-000000000007"), types.UID("3f1c2b4e-0000-4000-8000-000000000008")
	srv.Expect(uid, incoming, "node-a", 1)
	srv.ExpectDisks(uid, nbd)
	srv.Expect(idle, incoming, "node-a", 1)
	tun := migproxy.NewTunnel(agentCerts(t, ca, "node-a"), testr.New(t))
	tun.AcceptTimeout = 300 * time.Millisecond

	// As the source's agent does: both sockets at once, the memory's first.
	memOut, nbdOut := filepath.Join(dir, "mem-out.sock"), filepath.Join(dir, "nbd-out.sock")
	stopMem, err := tun.Forward(memOut, os.Getuid(), srv.Addr(), "node-b", uid, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer stopMem()
	stopDisks, err := tun.ForwardDisks(nbdOut, os.Getuid(), srv.Addr(), "node-b", uid)
	if err != nil {
		t.Fatal(err)
	}
	defer stopDisks()
	disk, err := net.DialTimeout("unix", nbdOut, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(disk, "a disk copied for longer than the accept timeout"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * tun.AcceptTimeout)
	_ = disk.(*net.UnixConn).CloseWrite()
	_, _ = io.ReadAll(disk)
	_ = disk.Close()
	arrives(t, gotDisks, "a disk copied for longer than the accept timeout", "the disk stream")
	if err := trySend(memOut, "the guest's state"); err != nil {
		t.Fatalf("the memory stream after a long disk copy: %v", err)
	}
	arrives(t, gotMemory, "the guest's state", "the memory stream")

	// A migration with nothing under way still stops listening.
	idleOut := filepath.Join(dir, "idle-out.sock")
	stopIdle, err := tun.Forward(idleOut, os.Getuid(), srv.Addr(), "node-b", idle, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer stopIdle()
	time.Sleep(5 * tun.AcceptTimeout)
	if err := trySend(idleOut, "too late"); err == nil {
		t.Fatal("a source connected to a tunnel past its accept timeout")
	}
}
