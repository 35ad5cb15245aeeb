package guestagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// fakeAgent answers each command line the client writes with reply(cmd, id), where id is
// guest-sync-delimited's argument. It runs until the connection closes.
func fakeAgent(t *testing.T, reply func(cmd string, id int64) string) *Client {
	t.Helper()
	host, guest := net.Pipe()
	go func() {
		defer guest.Close()
		sc := bufio.NewScanner(guest)
		sc.Buffer(make([]byte, 4096), 1<<20)
		for sc.Scan() {
			var req struct {
				Execute   string `json:"execute"`
				Arguments struct {
					ID int64 `json:"id"`
				} `json:"arguments"`
			}
			if json.Unmarshal(trimDelimiters(sc.Bytes()), &req) != nil {
				continue
			}
			out := reply(req.Execute, req.Arguments.ID)
			if out == "" {
				continue // stop answering
			}
			if _, err := guest.Write([]byte(out)); err != nil {
				return
			}
		}
	}()
	c := New(host)
	t.Cleanup(func() { c.Close() })
	return c
}

func syncReply(id int64) string {
	b, _ := json.Marshal(map[string]int64{"return": id})
	return "\xff" + string(b) + "\n"
}

func TestSyncSkipsStaleReplies(t *testing.T) {
	c := fakeAgent(t, func(cmd string, id int64) string {
		switch cmd {
		case "guest-sync-delimited":
			// Replies meant for an earlier client come first, then garbage, then ours.
			return `{"return": 42}` + "\n" + `{"error": {"class": "GenericError", "desc": "x"}}` + "\nnot json\n" + syncReply(id)
		case "guest-get-osinfo":
			return `{"return": {"id": "debian", "pretty-name": "Debian GNU/Linux 12", "kernel-release": "6.1.0"}}` + "\n"
		}
		return `{"error": {"class": "CommandNotFound", "desc": "no"}}` + "\n"
	})
	ctx := context.Background()
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	os, err := c.OSInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if os.ID != "debian" || os.PrettyName != "Debian GNU/Linux 12" || os.KernelRelease != "6.1.0" {
		t.Errorf("os info %+v", os)
	}
	// An error reply leaves the client usable.
	var agentErr *Error
	if _, err := c.Users(ctx); !errors.As(err, &agentErr) || agentErr.Class != "CommandNotFound" {
		t.Errorf("users: %v, want a CommandNotFound *Error", err)
	}
	if _, err := c.OSInfo(ctx); err != nil {
		t.Errorf("after an error reply: %v", err)
	}
}

func TestOversizedReplyBreaksClient(t *testing.T) {
	c := fakeAgent(t, func(cmd string, id int64) string {
		if cmd == "guest-sync-delimited" {
			return syncReply(id)
		}
		return `{"return": "` + strings.Repeat("a", MaxReplyBytes) + `"}` + "\n"
	})
	ctx := context.Background()
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.FreezeStatus(ctx); !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("oversized reply: %v, want ErrReplyTooLarge", err)
	}
	if _, err := c.FreezeStatus(ctx); !errors.Is(err, ErrBroken) {
		t.Errorf("after an oversized reply: %v, want ErrBroken", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestSilentAgentTimesOut(t *testing.T) {
	// The agent answers the sync, then stops in the middle of a reply.
	c := fakeAgent(t, func(cmd string, id int64) string {
		if cmd == "guest-sync-delimited" {
			return syncReply(id)
		}
		return `{"return": [{"name": "eth0", "ip-addr`
	})
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Interfaces(ctx)
	if err == nil {
		t.Fatal("no error from a reply cut short")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a silent agent held the call for %v", d)
	}
	// Another caller is not stuck behind it either.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := c.Ping(ctx2); !errors.Is(err, ErrBroken) {
		t.Errorf("ping after a timeout: %v, want ErrBroken", err)
	}
}

func TestSyncGivesUpOnGarbage(t *testing.T) {
	c := fakeAgent(t, func(cmd string, id int64) string {
		return strings.Repeat("{\"return\": 1}\n", maxSkipped+1)
	})
	if err := c.Sync(context.Background()); err == nil {
		t.Fatal("sync succeeded without its reply")
	}
}

func TestDecodeInterfacesBounds(t *testing.T) {
	var addrs []string
	for range MaxItems + 10 {
		addrs = append(addrs, `{"ip-address-type": "ipv6", "ip-address": "fe80::1", "prefix": 64}`)
	}
	iface := `{"name": "` + strings.Repeat("é", MaxString) + `", "hardware-address": "52:54:00:AA:BB:CC", "ip-addresses": [` +
		`{"ip-address-type": "ipv4", "ip-address": "10.0.2.15", "prefix": 24},` +
		`{"ip-address-type": "ipv4", "ip-address": "not-an-ip", "prefix": 24},` +
		`{"ip-address-type": "ipv4", "ip-address": "10.0.2.16", "prefix": 99},` +
		strings.Join(addrs, ",") + `]}`
	var list []string
	for range MaxItems * 3 {
		list = append(list, iface)
	}
	got, err := DecodeInterfaces(json.RawMessage("[" + strings.Join(list, ",") + "]"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxItems {
		t.Fatalf("%d interfaces, want the cap %d", len(got), MaxItems)
	}
	i := got[0]
	if len(i.Name) > MaxString || i.MAC != "52:54:00:aa:bb:cc" {
		t.Errorf("name %d bytes, mac %q", len(i.Name), i.MAC)
	}
	if len(i.Addresses) != MaxItems-3+1 || i.Addresses[0].IP.String() != "10.0.2.15" || i.Addresses[0].Prefix != 24 ||
		i.Addresses[1].IP.String() != "fe80::1" {
		t.Errorf("addresses %d: %v...", len(i.Addresses), i.Addresses[:2])
	}
}

// The cap is found by counting the list's own commas: those inside names, in nested lists and
// objects, and after escaped quotes and backslashes do not count, and a garbled element past the
// cap still fails the reply.
func TestDecodeInterfacesCapCountsTheListsOwnCommas(t *testing.T) {
	names := []string{`a,b`, `c]d`, `e},{\"name\": \"f`, `g\"`, `h\\`, `i\\\",`}
	var list []string
	for i := range MaxItems + 5 {
		name := names[i%len(names)]
		list = append(list, ` {"name": "`+name+`", "ip-addresses": [ ], "statistics": {"a": [1, [2, 3]], "b": {"c": ","}}}`)
	}
	raw := json.RawMessage("[" + strings.Join(list, " , ") + "\n]")
	before := bytes.Clone(raw)
	got, err := DecodeInterfaces(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, before) {
		t.Error("decoding changed the reply: another decoder of the same reply would read the cut")
	}
	if len(got) != MaxItems {
		t.Fatalf("%d interfaces, want the cap %d", len(got), MaxItems)
	}
	for i, in := range got {
		var want string
		if err := json.Unmarshal([]byte(`"`+names[i%len(names)]+`"`), &want); err != nil {
			t.Fatal(err)
		}
		if in.Name != want {
			t.Errorf("interface %d is %q, want %q", i, in.Name, want)
		}
	}
	// The elements past the cap are not decoded, but json.Unmarshal checks the whole reply first.
	garbled := "[" + strings.Join(list, ",") + `, {"name": }]`
	if _, err := DecodeInterfaces(json.RawMessage(garbled)); err == nil {
		t.Error("a reply garbled past the cap decoded")
	}
}

// A list given as null is no list; one given as anything else is an error naming it.
func TestDecodeInterfacesListKinds(t *testing.T) {
	got, err := DecodeInterfaces(json.RawMessage(`[{"name": "eth0", "ip-addresses": null}]`))
	if err != nil || len(got) != 1 || got[0].Addresses != nil {
		t.Errorf("ip-addresses null: %+v, %v; want eth0 without addresses", got, err)
	}
	if got, err := DecodeInterfaces(json.RawMessage(`null`)); err != nil || len(got) != 0 {
		t.Errorf("null: %#v, %v; want no interfaces", got, err)
	}
	_, err = DecodeInterfaces(json.RawMessage(`[{"name": "eth0", "ip-addresses": {"ip-address": "10.0.0.1"}}]`))
	if err == nil || !strings.Contains(err.Error(), "ip-addresses") || !strings.Contains(err.Error(), "object") {
		t.Errorf("ip-addresses as an object: %v; want an error naming the field and what it got", err)
	}
}

// deadlineConn records the last deadline set on it.
type deadlineConn struct {
	net.Conn
	last time.Time
}

func (d *deadlineConn) SetDeadline(t time.Time) error {
	d.last = t
	return d.Conn.SetDeadline(t)
}

// A call leaves no deadline on the connection: one left set is a timer that fires after the call
// and wakes the idle launcher (every poll of a connected agent, 5 s after it).
func TestCallLeavesNoDeadline(t *testing.T) {
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	go func() {
		sc := bufio.NewScanner(guest)
		for sc.Scan() {
			if _, err := guest.Write([]byte(`{"return": {"id": "debian"}}` + "\n")); err != nil {
				return
			}
		}
	}()
	conn := &deadlineConn{Conn: host}
	c := New(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.OSInfo(ctx); err != nil {
		t.Fatal(err)
	}
	if !conn.last.IsZero() {
		t.Errorf("after the call the connection's deadline is %v, want none", conn.last)
	}
}
