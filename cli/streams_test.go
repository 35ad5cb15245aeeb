package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// The console waits for a starting VMI, then carries bytes both ways through a real pty in raw
// mode; Ctrl+] leaves with status 0 and the terminal is restored.
func TestConsoleThroughAPty(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	vmi := createVMI(t, "ns-a", "con-pty", qv1.Scheduled)
	master, slave := testutil.OpenPTY(t)
	screen := collect(master)
	var errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"qvirtctl", "console", "con-pty", "--kubeconfig", kc}, slave, slave, &errOut)
	}()
	eventually(t, 10*time.Second, "waiting message", func() (bool, string) {
		return strings.Contains(errOut.String(), "waiting for VMI con-pty to run (phase Scheduled)"), errOut.String()
	})
	setPhase(t, vmi, qv1.Running)
	eventually(t, 10*time.Second, "guest banner", func() (bool, string) {
		return strings.Contains(screen.String(), "QVIRT-GUEST-READY"), screen.String()
	})
	if canonical(t, slave) {
		t.Error("the console did not put the terminal in raw mode")
	}
	if _, err := master.Write([]byte("echo qvirt-$((6*7))\r")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "echo from the guest side", func() (bool, string) {
		return strings.Contains(screen.String(), "got:echo qvirt-$((6*7))\r"), screen.String()
	})
	if _, err := master.Write([]byte{0x1d}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("console after Ctrl+]: exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("console did not leave on Ctrl+]")
	}
	if !canonical(t, slave) {
		t.Error("the terminal was left in raw mode")
	}
	if !strings.Contains(errOut.String(), "Press Ctrl+] to exit.") {
		t.Errorf("no connection message in %q", errOut.String())
	}
}

func canonical(t *testing.T, f *os.File) bool {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return tio.Lflag&unix.ICANON != 0
}

// A second console session takes over: the first prints why and exits 1. Both run on pipes.
func TestConsoleTakeover(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "con-take", qv1.Running)
	inR, inW := io.Pipe()
	defer inW.Close()
	var out1, err1 lockedBuffer
	first := make(chan int, 1)
	go func() {
		first <- Main([]string{"qvirtctl", "console", "con-take", "--kubeconfig", kc}, inR, &out1, &err1)
	}()
	eventually(t, 10*time.Second, "first session", func() (bool, string) {
		return strings.Contains(out1.String(), "QVIRT-GUEST-READY"), out1.String()
	})
	in2R, in2W := io.Pipe()
	var out2, err2 lockedBuffer
	second := make(chan int, 1)
	go func() {
		second <- Main([]string{"qvirtctl", "console", "con-take", "--kubeconfig", kc}, in2R, &out2, &err2)
	}()
	select {
	case code := <-first:
		if code != 1 || !strings.Contains(err1.String(), "error: console taken over: taken over by a console session of user bob") {
			t.Errorf("taken-over session: exit %d, stderr %q", code, err1.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first session did not end on takeover")
	}
	// The new session works and Ctrl+] as a byte on a pipe ends it.
	eventually(t, 10*time.Second, "second session", func() (bool, string) {
		return strings.Contains(out2.String(), "QVIRT-GUEST-READY"), out2.String()
	})
	_, _ = in2W.Write([]byte("ls\n"))
	eventually(t, 10*time.Second, "echo in the second session", func() (bool, string) {
		return strings.Contains(out2.String(), "got:ls\n"), out2.String()
	})
	_, _ = in2W.Write([]byte("\x1d"))
	select {
	case code := <-second:
		if code != 0 || !strings.Contains(out2.String(), "got:ls\n") {
			t.Errorf("second session: exit %d, stdout %q, stderr %q", code, out2.String(), err2.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second session did not end on 0x1d")
	}
}

// Piped input: the output after the last line is still shown, then the console exits 0. A server
// close (the VM stopped) ends a session with 0 and says so.
func TestConsolePipedAndServerClose(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "con-pipe", qv1.Running)
	out, errOut, code := run(t, strings.NewReader("uname\n"), "console", "con-pipe", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(out, "got:uname\n") {
		t.Errorf("piped console: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = run(t, strings.NewReader("poweroff\r"), "console", "con-pipe", "--kubeconfig", kc)
	if code != 0 || !strings.Contains(errOut, "console closed by the server: the VM stopped") {
		t.Errorf("server close: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// A VMI that ended is an error at once, with what to do.
	createVMI(t, "ns-a", "con-done", qv1.Succeeded)
	_, errOut, code = run(t, nil, "console", "con-done", "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, "VMI con-done has ended (phase Succeeded)") || !strings.Contains(errOut, "qvirtctl start con-done") {
		t.Errorf("ended VMI: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = run(t, nil, "console", "nosuchvmi", "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, `Error from server (NotFound): virtualmachineinstances.qvirt.io "nosuchvmi" not found`) {
		t.Errorf("unknown VMI: exit %d, stderr %q", code, errOut)
	}
	createVMI(t, "ns-a", "con-slow", qv1.Pending)
	_, errOut, code = run(t, nil, "console", "con-slow", "--timeout", "500ms", "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, "VMI con-slow not reachable within --timeout 500ms") {
		t.Errorf("timeout: exit %d, stderr %q", code, errOut)
	}
}

func TestQMPOneShot(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "q1", qv1.Running)
	out, errOut, code := run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--", "query-status")
	var st struct{ Status string }
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Status != "running" || !strings.Contains(out, "\n  \"running\": true") {
		t.Errorf("query-status: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--", "query-status", `{ "x": 1 }`)
	if code != 0 || !strings.Contains(out, "running") {
		t.Errorf("query-status with args: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, errOut, code = run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--", "stop")
	if code != 1 || !strings.Contains(errOut, "error: QMP stop: GenericError: \"stop\" is not read-only") || !strings.Contains(errOut, "qvirt.io:admin") {
		t.Errorf("refused write: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--", "frobnicate")
	if code != 1 || !strings.Contains(errOut, "error: QMP frobnicate: CommandNotFound: The command frobnicate has not been found") {
		t.Errorf("unknown command: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--", "x-drop")
	if code != 1 || !strings.Contains(errOut, "error: QMP session closed by the server (status 1001): qvirt-handler is shutting down") {
		t.Errorf("closed mid-command: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code = run(t, nil, "--kubeconfig", kc, "qmp", "q1", "--hmp", "info status")
	if code != 0 || out != "VM status: running\n(from info status)\n" {
		t.Errorf("--hmp: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	f.mu.Lock()
	sent := strings.Join(f.qmpSent, "|")
	f.mu.Unlock()
	for _, want := range []string{"qmp_capabilities ", `query-status {"x":1}`, `human-monitor-command {"command-line":"info status"}`} {
		if !strings.Contains(sent, want) {
			t.Errorf("QEMU did not receive %q; got %q", want, sent)
		}
	}
}

// The interactive shell on a terminal completes command names from query-commands on Tab.
func TestQMPShellCompletesOnATerminal(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "q2", qv1.Running)
	master, slave := testutil.OpenPTY(t)
	screen := collect(master)
	var errOut lockedBuffer
	done := make(chan int, 1)
	go func() { done <- Main([]string{"qvirtctl", "qmp", "q2", "--kubeconfig", kc}, slave, slave, &errOut) }()
	eventually(t, 10*time.Second, "prompt", func() (bool, string) { return strings.Contains(screen.String(), "(qmp) "), screen.String() })
	_, _ = master.Write([]byte("query-st\t"))
	eventually(t, 5*time.Second, "completed name", func() (bool, string) {
		return strings.Contains(screen.String(), "query-status "), screen.String()
	})
	_, _ = master.Write([]byte("\r"))
	eventually(t, 5*time.Second, "reply", func() (bool, string) {
		return strings.Contains(screen.String(), `"status": "running"`), screen.String()
	})
	// Ambiguous prefix: Tab lists the candidates.
	_, _ = master.Write([]byte("query-\t"))
	eventually(t, 5*time.Second, "candidates", func() (bool, string) {
		return strings.Contains(screen.String(), "query-commands  query-status  query-version"), screen.String()
	})
	_, _ = master.Write([]byte("\x15quit\r")) // Ctrl+U clears the line
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("shell: exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("shell did not quit; screen %q", screen.String())
	}
}

// Piped shell: one reply per line, events on stderr, exit 1 when a command failed.
func TestQMPShellPiped(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "q3", qv1.Running)
	in := "query-status\n{\"execute\": \"query-version\"}\nhmp info status\nquery-status {oops\n"
	out, errOut, code := run(t, strings.NewReader(in), "qmp", "q3", "--kubeconfig", kc)
	if code != 1 {
		t.Errorf("exit %d, want 1 (one command failed)", code)
	}
	if !strings.Contains(out, `"status": "running"`) || !strings.Contains(out, "VM status: running") {
		t.Errorf("stdout %q", out)
	}
	if !strings.Contains(errOut, "CommandNotFound: The command query-version") || !strings.Contains(errOut, `JSON-ARGS of query-status: "{oops"`) {
		t.Errorf("stderr %q", errOut)
	}
}

func TestVNCProxiesEachConnection(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "v1", qv1.Running)
	ctx, cancel := context.WithCancel(context.Background())
	root := New("qvirtctl")
	outR, outW := io.Pipe()
	root.SetArgs([]string{"vnc", "v1", "--port", "0", "--kubeconfig", kc})
	root.SetOut(outW)
	var errOut lockedBuffer
	root.SetErr(&errOut)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^VNC for VMI v1 listening on (127\.0\.0\.1:\d+)\n$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("vnc printed %q", line)
	}
	for i := range 2 {
		c, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		greet := make([]byte, 12)
		if _, err := io.ReadFull(c, greet); err != nil || string(greet) != "RFB 003.008\n" {
			t.Fatalf("connection %d: greeting %q, %v", i, greet, err)
		}
		msg := bytes.Repeat([]byte{byte(i), 0xff}, 50000)
		go func() { _, _ = c.Write(msg) }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("connection %d: echo differs (%v)", i, err)
		}
		c.Close()
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("vnc ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("vnc did not stop when its context ended")
	}
}

func TestScreenshotWritesAValidPNG(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	file := t.TempDir() + "/shot.png"
	_, errOut, code := run(t, nil, "vnc", "screenshot", "s1", "-o", file, "--kubeconfig", kc)
	if code != 0 || !strings.Contains(errOut, "wrote "+file+" (720x400, ") {
		t.Fatalf("screenshot: exit %d, stderr %q", code, errOut)
	}
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	img, err := png.Decode(fh)
	if err != nil || img.Bounds().Dx() != 720 || img.Bounds().Dy() != 400 {
		t.Errorf("written file: %v, %v", img.Bounds(), err)
	}
	bad := t.TempDir() + "/bad.png"
	_, errOut, code = run(t, nil, "vnc", "screenshot", "garbage", "-o", bad, "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, "is not a PNG image") {
		t.Errorf("garbage screenshot: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("a file was written for a non-PNG answer: %v", err)
	}
}

// With --reconnect a console whose guest stopped waits for the instance and reattaches.
func TestConsoleReconnects(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	vmi := createVMI(t, "ns-a", "con-again", qv1.Running)
	inR, inW := io.Pipe()
	defer inW.Close()
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"qvirtctl", "console", "con-again", "--reconnect", "--kubeconfig", kc}, inR, &out, &errOut)
	}()
	eventually(t, 10*time.Second, "first banner", func() (bool, string) {
		return strings.Count(out.String(), "QVIRT-GUEST-READY") == 1, out.String()
	})
	setPhase(t, vmi, qv1.Scheduling) // the restarted instance is on its way
	_, _ = inW.Write([]byte("poweroff\r"))
	eventually(t, 10*time.Second, "waiting after the close", func() (bool, string) {
		return strings.Contains(errOut.String(), "waiting for VMI con-again to run (phase Scheduling)"), errOut.String()
	})
	setPhase(t, vmi, qv1.Running)
	eventually(t, 10*time.Second, "second banner", func() (bool, string) {
		return strings.Count(out.String(), "QVIRT-GUEST-READY") == 2, out.String()
	})
	_, _ = inW.Write([]byte{0x1d})
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("console did not leave on Ctrl+]")
	}
}

// A refused upgrade reads as kubectl's Forbidden with advice on the role to ask for.
func TestStreamForbidden(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "forbidden-con", qv1.Running)
	_, errOut, code := run(t, nil, "console", "forbidden-con", "--kubeconfig", kc)
	want := `Error from server (Forbidden): virtualmachineinstances.subresources.qvirt.io "forbidden-con" is forbidden: User "tester" cannot get resource "virtualmachineinstances/console"`
	if code != 1 || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "qvirt.io:edit") {
		t.Errorf("forbidden console: exit %d, stderr %q", code, errOut)
	}
}
