package launcher_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/migproxy"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
	"github.com/qvirt/qvirt/test/testutil"
)

// BenchmarkStartToRunning measures exec → guest vCPUs running through the launcher (validate,
// resolve, build argv, exec QEMU, connect QMP, cont) against bare QEMU started with the same argv
// and resumed over QMP by the same client, side by side in one run.
func BenchmarkStartToRunning(b *testing.B) {
	var viaLauncher, bare time.Duration
	for i := 0; i < b.N; i++ {
		viaLauncher += startViaLauncher(b)
		bare += startBare(b)
	}
	b.ReportMetric(float64(viaLauncher.Milliseconds())/float64(b.N), "launcher-ms")
	b.ReportMetric(float64(bare.Milliseconds())/float64(b.N), "bare-qemu-ms")
	b.ReportMetric(float64(viaLauncher)/float64(bare), "ratio-vs-bare-qemu")
}

func benchMachine(b *testing.B) *launcher.Machine { return machineFor(b, guestSpec(b)) }

// machineFor resolves req in a new run directory removed when the benchmark ends.
func machineFor(b *testing.B, req *protocol.SyncRequest) *launcher.Machine {
	b.Helper()
	dir, err := os.MkdirTemp("", "qvb-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	m, err := launcher.HostResolver{SpareRootPorts: 2}.Resolve(&req.Machine, dir)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func startViaLauncher(b *testing.B) time.Duration {
	dir, err := os.MkdirTemp("", "qvb-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l := launcher.New(dir, launcher.HostResolver{SpareRootPorts: 2}, launcher.Options{Log: logr.Discard()})
	req := guestSpec(b)
	start := time.Now()
	if err := l.Sync(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	st, _ := l.Status(context.Background())
	if st.RunState != string(qmp.StateRunning) {
		b.Fatalf("run state %s after Sync", st.RunState)
	}
	_ = l.Kill(context.Background())
	_, _ = l.Wait(context.Background())
	return elapsed
}

func startBare(b *testing.B) time.Duration {
	m := benchMachine(b)
	argv, err := launcher.BuildArgv(m)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	cmd := exec.Command("qemu-system-x86_64", argv...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	mon := dialWhenListening(b, m.QMPSocket())
	defer mon.Close()
	if err := mon.Cont(context.Background()); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkLauncherRSS runs `qvirt-launcher run` with the test guest and reports the launcher's own
// resident memory (QEMU not counted) once the guest runs.
func BenchmarkLauncherRSS(b *testing.B) {
	bin, vmi := launcherBinary(b), guestMachineFile(b)
	var total, private float64
	for i := 0; i < b.N; i++ {
		l, _ := startRunLauncher(b, bin, vmi)
		time.Sleep(2 * time.Second) // steady state: the guest boots, the launcher serves
		total += statusMiB(b, l.cmd.Process.Pid, "VmRSS:")
		private += statusMiB(b, l.cmd.Process.Pid, "RssAnon:")
		l.stop()
	}
	testutil.ReportGoal(b, total/float64(b.N), "launcher-rss-MiB", 8)
	// The rest of the RSS is the binary's mapped pages (RssFile), which every launcher on a node
	// shares through the page cache: the private part is what each further VM costs.
	testutil.ReportGoal(b, private/float64(b.N), "launcher-private-MiB", 2.5)
}

// BenchmarkLauncherIdle reports the CPU an idle launcher uses per minute, QEMU's not counted,
// in the same window for three processes started together:
//   - idle-agent-cpu-ms-per-min: a launcher whose guest's agent is connected and polled (the goal's
//     case), with a status watch open as its node agent keeps one;
//   - idle-cpu-ms-per-min: the same without an agent in the guest (the startup benchmark's case);
//   - go-floor-cpu-ms-per-min: a Go process that does nothing (testdata/idlefloor), what the Go
//     runtime alone costs a sleeping process on this machine.
//
// …-wakeups-per-min are how many times the same processes' threads ran: what the CPU figures are
// made of. Each wake-up's price moves tenfold with the machine's neighbours here; their count does
// not.
//
// The window starts once the agent's polls have backed off to AgentPollMax and lasts
// WatchHeartbeat, so it holds what a long-idle instance costs: one heartbeat per watch and a poll
// every AgentPollMax.
func BenchmarkLauncherIdle(b *testing.B) {
	bin := launcherBinary(b)
	floorBin := filepath.Join(b.TempDir(), "idlefloor")
	build := exec.Command("go", "build", "-trimpath", "-o", floorBin, "./testdata/idlefloor")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build testdata/idlefloor: %v\n%s", err, out)
	}
	// qvirt.agent=0: the test guest's init starts no qemu-ga.
	withAgent, without := guestMachineFile(b), guestMachineFile(b, "qvirt.agent=0")
	// A minute of fast polls, then 20 and 40 s: at AgentPollMax after 2 minutes, with a margin for
	// a change soon after the agent connected (its address).
	const settle = 150 * time.Second
	window := launcher.WatchHeartbeat
	var agent, plain, floor schedDelta
	for i := 0; i < b.N; i++ {
		withAgentL, _ := startRunLauncher(b, bin, withAgent)
		plainL, _ := startRunLauncher(b, bin, without)
		floorCmd := exec.Command(floorBin)
		floorCmd.Env = append(os.Environ(), "GOMAXPROCS=1") // as the launcher runs
		if err := floorCmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = floorCmd.Process.Kill(); _ = floorCmd.Wait() })
		stopWatches := watchStatus(withAgentL, plainL)
		withAgentL.waitStatus(b, 2*time.Minute, "its guest agent to connect", agentConnected)
		time.Sleep(settle)
		pids := []int{withAgentL.cmd.Process.Pid, plainL.cmd.Process.Pid, floorCmd.Process.Pid}
		deltas := []*schedDelta{&agent, &plain, &floor}
		for j, pid := range pids {
			deltas[j].begin(b, pid)
		}
		time.Sleep(window)
		for j, pid := range pids {
			deltas[j].end(b, pid)
		}
		stopWatches()
		withAgentL.stop()
		plainL.stop()
	}
	minutes := float64(b.N) * window.Minutes()
	perMin := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / minutes }
	// The goal is all of qvirt's per idle instance; the launcher's is most of it.
	testutil.ReportGoal(b, perMin(agent.cpu), "idle-agent-cpu-ms-per-min", 1)
	b.ReportMetric(perMin(plain.cpu), "idle-cpu-ms-per-min")
	b.ReportMetric(perMin(floor.cpu), "go-floor-cpu-ms-per-min")
	// What the CPU figures are made of: wake-ups, whose count does not move with the machine.
	b.ReportMetric(float64(agent.runs)/minutes, "idle-agent-wakeups-per-min")
	b.ReportMetric(float64(plain.runs)/minutes, "idle-wakeups-per-min")
	b.ReportMetric(float64(floor.runs)/minutes, "go-floor-wakeups-per-min")
}

// schedDelta adds up a process's CPU time and wake-ups between begin and end (testutil.SchedStats).
type schedDelta struct {
	cpu, cpu0   time.Duration
	runs, runs0 int64
}

func (d *schedDelta) begin(b *testing.B, pid int) { d.cpu0, d.runs0 = testutil.MustSchedStats(b, pid) }

func (d *schedDelta) end(b *testing.B, pid int) {
	cpu, runs := testutil.MustSchedStats(b, pid)
	d.cpu += cpu - d.cpu0
	d.runs += runs - d.runs0
}

// BenchmarkLauncherProbe reports what qvirt spends on one probe of each kind that goes through
// the guest agent, the cost the idle goal leaves out ("no probes"): the `qvirt-launcher probe`
// process the kubelet execs in the compute container (its own CPU, user and system) plus what its
// launcher spends answering it, for a guestAgentPing probe (ping-probe-cpu-ms) and an exec probe
// running `true` in the guest (exec-probe-cpu-ms), and what each costs a minute at KubeVirt's
// default period of 10 s (…-per-min); …-launcher-cpu-ms is the launcher's part. Not counted:
// the kubelet's and the container runtime's work to exec the process (Kubernetes' share), QEMU's
// and the guest agent's. TCP and HTTP probes are the kubelet's alone. The agent's polls of its
// first minute may fall into a probe's window, so run it with -benchtime=20x or more.
func BenchmarkLauncherProbe(b *testing.B) {
	bin := launcherBinary(b)
	l, _ := startRunLauncher(b, bin, guestMachineFile(b))
	l.waitStatus(b, 2*time.Minute, "its guest agent to connect", agentConnected)
	socketDir, uid := filepath.Split(l.runDir)
	// probe runs one probe and returns the probe process's CPU and its launcher's.
	probe := func(kind string, command ...string) (proc, served time.Duration) {
		args := []string{"probe", "--socket-dir", socketDir, "--vmi-uid", uid, "--" + kind, "--timeout", "5s"}
		if len(command) > 0 {
			args = append(append(args, "--"), command...)
		}
		before := taskCPU(b, l.cmd.Process.Pid)
		cmd := exec.Command(bin, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("qvirt-launcher %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), taskCPU(b, l.cmd.Process.Pid) - before
	}
	// The first of each kind warms the launcher's and the guest's paths; then the timer counts
	// probes only, not the guest's boot.
	probe("guest-agent-ping")
	probe("guest-exec", "true")
	b.ResetTimer()
	var pingProc, pingLauncher, execProc, execLauncher time.Duration
	for i := 0; i < b.N; i++ {
		p, s := probe("guest-agent-ping")
		pingProc, pingLauncher = pingProc+p, pingLauncher+s
		p, s = probe("guest-exec", "true")
		execProc, execLauncher = execProc+p, execLauncher+s
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	const perMin = 6 // a probe every 10 s
	b.ReportMetric(ms(pingProc+pingLauncher), "ping-probe-cpu-ms")
	b.ReportMetric(ms(pingLauncher), "ping-probe-launcher-cpu-ms")
	b.ReportMetric(perMin*ms(pingProc+pingLauncher), "ping-probe-cpu-ms-per-min")
	b.ReportMetric(ms(execProc+execLauncher), "exec-probe-cpu-ms")
	b.ReportMetric(ms(execLauncher), "exec-probe-launcher-cpu-ms")
	b.ReportMetric(perMin*ms(execProc+execLauncher), "exec-probe-cpu-ms-per-min")
}

// watchStatus keeps a status watch open on each launcher, as a node agent does, until the
// returned stop is called.
func watchStatus(ls ...*runLauncher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = l.client.Watch(ctx, func(protocol.Status) bool { return true })
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// BenchmarkLauncherStartCPU reports the CPU a launcher spends from its exec until its guest's
// vCPUs run (all of the launcher's threads; QEMU's not counted), and the wall time of that span. A
// status watch is open from the moment the command socket appears, as a node agent keeps one, so
// what the launcher spends telling it is counted too.
func BenchmarkLauncherStartCPU(b *testing.B) {
	bin, vmi := launcherBinary(b), guestMachineFile(b)
	var cpu, wall time.Duration
	for i := 0; i < b.N; i++ {
		c, w := launcherStartCPU(b, bin, vmi)
		cpu += c
		wall += w
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "launcher-start-cpu-ms")
	b.ReportMetric(float64(wall.Microseconds())/1000/float64(b.N), "launcher-start-ms")
}

// launcherStartCPU runs `bin run` for the machine file vmi until its guest runs, and returns the
// launcher's CPU time and the wall time until then.
func launcherStartCPU(b *testing.B, bin, vmi string) (cpu, wall time.Duration) {
	l, wall := startRunLauncher(b, bin, vmi)
	defer l.stop()
	return taskCPU(b, l.cmd.Process.Pid), wall
}

// launcherBinary builds qvirt-launcher as `make build` builds it (static, so no libc or ld.so pages
// count) and returns its path.
func launcherBinary(b *testing.B) string {
	dir := b.TempDir()
	if err := testutil.BuildCommands("..", dir, "qvirt-launcher"); err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "qvirt-launcher")
}

type runLauncher struct {
	cmd     *exec.Cmd
	client  *launcher.Client
	runDir  string
	stderr  *bytes.Buffer
	exited  chan struct{} // closed when cmd.Wait returned, with waitErr
	waitErr error
}

// startRunLauncher runs `bin run` for the machine file vmi and returns once its guest runs, with
// the time from its exec until then.
func startRunLauncher(b *testing.B, bin, vmi string) (*runLauncher, time.Duration) {
	runDir, err := os.MkdirTemp("", "qvb-")
	if err != nil {
		b.Fatal(err)
	}
	l := &runLauncher{cmd: exec.Command(bin, "run", "--no-console", "--run-dir", runDir, "-f", vmi), runDir: runDir,
		client: launcher.NewClient(filepath.Join(runDir, launcher.SocketName)), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	l.cmd.Stderr = l.stderr
	start := time.Now()
	if err := l.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { l.waitErr = l.cmd.Wait(); close(l.exited) }()
	b.Cleanup(l.stop)
	l.waitStatus(b, time.Minute, "its guest to run", func(st protocol.Status) bool { return st.RunState == string(qmp.StateRunning) })
	return l, time.Since(start)
}

func agentConnected(st protocol.Status) bool { return st.GuestAgent != nil && st.GuestAgent.Connected }

// waitStatus watches l's status until cond holds, for at most d, as a node agent watches it: no
// polling of the launcher's own. Until the launcher listens a dial is refused at once (the kernel
// answers, not the launcher), so retrying costs the launcher nothing.
func (l *runLauncher) waitStatus(b *testing.B, d time.Duration, what string, cond func(protocol.Status) bool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		done := false
		err := l.client.Watch(ctx, func(st protocol.Status) bool {
			done = cond(st)
			return !done
		})
		if done {
			return
		}
		select {
		case <-l.exited:
			b.Fatalf("the launcher exited while waiting for %s: %v\n%s", what, l.waitErr, l.stderr.Bytes())
		case <-ctx.Done():
			b.Fatalf("waited %s for %s: %v", d, what, err)
		case <-time.After(time.Millisecond):
		}
	}
}

func (l *runLauncher) stop() {
	select {
	case <-l.exited:
	default:
		_ = l.cmd.Process.Signal(syscall.SIGTERM)
		_ = l.client.Kill(context.Background())
		select {
		case <-l.exited:
		case <-time.After(30 * time.Second):
			_ = l.cmd.Process.Kill()
			<-l.exited
		}
	}
	_ = os.RemoveAll(l.runDir)
}

// taskCPU is the CPU time all of process pid's threads have run (schedstat, in nanoseconds: the
// clock-tick counts of /proc/PID/stat are too coarse for an idle minute). A launcher's threads
// live as long as it does (the Go runtime keeps them), so no thread's time is lost between two
// readings.
func taskCPU(b *testing.B, pid int) time.Duration {
	cpu, _ := testutil.MustSchedStats(b, pid)
	return cpu
}

// statusMiB is a kB field of /proc/PID/status (VmRSS:, RssAnon:) in MiB.
func statusMiB(b *testing.B, pid int, field string) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// BenchmarkMigration migrates an idle 256 MiB guest over loopback through two launchers and the
// same with bare QEMU and QMP, side by side, uncapped bandwidth. The guest has no kernel or disk:
// the firmware finds nothing to boot and halts, so the guest is idle from the start (a booting
// kernel under TCG dirties memory at a rate that depends on the moment and makes figures noise).
//
// QVIRT_BENCH_MIGRATION_TLS=1 sends the launchers' stream as a cluster does: from a unix socket of
// the source node agent, over the node agents' mutual TLS (handler/migproxy), to the target's
// socket; the bare QEMU anchor then uses QEMU's own TLS (tls-creds-x509 on both ends, the peer's
// certificate verified), so the ratio compares encrypted with encrypted.
//
// downtime-ms is QEMU's own figure (the source's stop until the target acknowledged the whole
// state); guest-pause-ms and bare-guest-pause-ms are what the guest lives through, from the
// source's STOP event to the target's RESUME event (QMP timestamps, one host clock), which for the
// launchers includes the handover (switchover.go) as the node agents play it: each side's status
// change wakes the next step at once, as an agent's status stream does, so the figure is the
// launchers' share, not the agents' API round trips.
func BenchmarkMigration(b *testing.B) {
	var viaLauncher, bare, pause, barePause time.Duration
	var downtime int64
	tunnel := os.Getenv("QVIRT_BENCH_MIGRATION_TLS") == "1"
	for i := 0; i < b.N; i++ {
		r := migrateViaLaunchers(b, tunnel)
		viaLauncher += r.elapsed
		downtime += r.downtimeMs
		pause += r.pause
		d, p := migrateBare(b, tunnel)
		bare += d
		barePause += p
	}
	b.ReportMetric(float64(viaLauncher.Milliseconds())/float64(b.N), "launcher-ms")
	b.ReportMetric(float64(bare.Milliseconds())/float64(b.N), "bare-qemu-ms")
	b.ReportMetric(float64(viaLauncher)/float64(bare), "migration-ratio-vs-bare-qemu")
	b.ReportMetric(float64(downtime)/float64(b.N), "downtime-ms")
	b.ReportMetric(float64(pause.Microseconds())/1000/float64(b.N), "guest-pause-ms")
	b.ReportMetric(float64(barePause.Microseconds())/1000/float64(b.N), "bare-guest-pause-ms")
}

// migrationRun is one migration through the launchers.
type migrationRun struct {
	elapsed    time.Duration
	downtimeMs int64
	pause      time.Duration
}

func migrateViaLaunchers(b *testing.B, tunnel bool) migrationRun {
	ctx := context.Background()
	const uid = "5b1ee53c-79b2-4d1c-a1c9-8d0d7d1e6b01"
	src, srcDir := benchLauncher(b, idleSpec(b), uid, false)
	srcClock := watchRunState(b, launcher.Dir(srcDir).ShellQMP())
	dst, dstDir := benchLauncher(b, idleSpec(b), uid, true)
	dstClock := watchRunState(b, launcher.Dir(dstDir).ShellQMP())
	time.Sleep(500 * time.Millisecond)
	listen := "127.0.0.1:0"
	if tunnel {
		listen = launcher.ListenUnix
	}
	uri, err := dst.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: listen})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if tunnel {
		uri = tunnelTo(b, strings.TrimPrefix(uri, "unix:"))
	}
	st := benchHandOver(b, src, dst, &protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: -1})
	r := migrationRun{elapsed: time.Since(start), pause: guestPause(b, srcClock, dstClock)}
	if st.Migration != nil {
		r.downtimeMs = st.Migration.DowntimeMs
	}
	_ = dst.Kill(ctx)
	return r
}

// benchLauncher runs a launcher in a directory of its own with req as the VMI uid (an incoming
// one for a migration target); the launcher is killed and the directory removed at the end.
func benchLauncher(b *testing.B, req *protocol.SyncRequest, uid string, incoming bool) (*launcher.Launcher, string) {
	dir, err := os.MkdirTemp("", "qvb-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	l := launcher.New(dir, launcher.HostResolver{SpareRootPorts: 2}, launcher.Options{Log: logr.Discard()})
	req.Machine.UID = uid
	req.Incoming = incoming
	if err := l.Sync(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Kill(context.Background()) })
	return l, dir
}

// benchHandOver migrates src's guest to dst the way the node agents drive it (migrate, both hold the
// handed-over guest, the target runs it, the source finishes) and returns the source's last
// status once it has ended as migrated.
func benchHandOver(b *testing.B, src, dst *launcher.Launcher, req *protocol.MigrationSource) protocol.Status {
	ctx := context.Background()
	if err := src.MigrateSource(ctx, req); err != nil {
		b.Fatal(err)
	}
	srcSt := waitHandover(b, src)
	waitHandover(b, dst)
	if err := dst.RunMigrated(ctx, &protocol.MigrationRun{Paused: srcSt.Migration.GuestPaused}); err != nil {
		b.Fatal(err)
	}
	if err := src.FinishMigration(ctx); err != nil {
		b.Fatal(err)
	}
	exit, err := src.Wait(ctx)
	st, _ := src.Status(ctx)
	if err != nil || exit.Reason != protocol.ExitMigrated {
		b.Fatalf("source ended %v %v, migration %+v", exit, err, st.Migration)
	}
	return st
}

// waitHandover waits, woken by each status change as a node agent's stream is, until l holds the
// migrated guest, and returns its status.
func waitHandover(b *testing.B, l *launcher.Launcher) protocol.Status {
	timeout := time.After(time.Minute)
	for {
		st, changed := l.Status(context.Background())
		if st.Migration != nil && st.Migration.Handover == protocol.HandoverHolding {
			return st
		}
		if st.Exit != nil || st.Migration != nil && st.Migration.Status == string(qmp.MigrationFailed) {
			b.Fatalf("migration ended without a handover: exit %+v, migration %+v", st.Exit, st.Migration)
		}
		select {
		case <-changed:
		case <-timeout:
			b.Fatalf("no handover within a minute: %+v", st.Migration)
		}
	}
}

// runStateClock keeps the QMP timestamps of a QEMU's last STOP event and of the first RESUME event
// after it, read from its second (operator) monitor.
type runStateClock struct {
	mu           sync.Mutex
	stop, resume time.Time
}

func watchRunState(b *testing.B, socket string) *runStateClock {
	mon := dialWhenListening(b, socket)
	b.Cleanup(func() { _ = mon.Close() })
	c := &runStateClock{}
	sub := mon.Subscribe(64)
	go func() {
		for ev := range sub.Events() {
			at := time.Unix(ev.Timestamp.Seconds, ev.Timestamp.Microseconds*1000)
			c.mu.Lock()
			switch ev.Event {
			case qmp.EventStop:
				c.stop, c.resume = at, time.Time{}
			case qmp.EventResume:
				if c.resume.IsZero() {
					c.resume = at
				}
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// guestPause is how long the guest stood still: from the source's stop to the target's resume.
func guestPause(b *testing.B, src, dst *runStateClock) time.Duration {
	var stop, resume time.Time
	deadline := time.Now().Add(10 * time.Second)
	for stop.IsZero() || resume.IsZero() {
		if time.Now().After(deadline) {
			b.Fatalf("no STOP on the source (%v) or RESUME on the target (%v)", stop, resume)
		}
		time.Sleep(5 * time.Millisecond)
		src.mu.Lock()
		stop = src.stop
		src.mu.Unlock()
		dst.mu.Lock()
		resume = dst.resume
		dst.mu.Unlock()
	}
	return resume.Sub(stop)
}

func migrateBare(b *testing.B, withTLS bool) (time.Duration, time.Duration) {
	ctx := context.Background()
	start := func(incoming bool) (*exec.Cmd, *qmp.Monitor, *runStateClock) {
		m := idleMachine(b)
		m.Incoming = incoming
		argv, err := launcher.BuildArgv(m)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("qemu-system-x86_64", argv...)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		mon := dialWhenListening(b, m.QMPSocket())
		b.Cleanup(func() { _ = mon.Close() })
		return cmd, mon, watchRunState(b, m.ShellQMPSocket())
	}
	srcCmd, src, srcClock := start(false)
	_, dst, dstClock := start(true)
	if err := src.Cont(ctx); err != nil {
		b.Fatal(err)
	}
	// The argv starts QEMU paused; plain QEMU migration runs the guest on the target as soon as it
	// arrives (QEMU's default for a target started without -S).
	if err := dst.Cont(ctx); err != nil {
		b.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	huge := int64(1) << 62
	params := qmp.MigrateParameters{MaxBandwidth: &huge}
	if withTLS {
		dir := qemuTLSDir(b)
		addTLSCreds(b, dst, dir, "server")
		addTLSCreds(b, src, dir, "client")
		creds, host := "tls0", "localhost"
		if err := dst.MigrateSetParameters(ctx, qmp.MigrateParameters{TLSCreds: &creds}); err != nil {
			b.Fatal(err)
		}
		params.TLSCreds, params.TLSHostname = &creds, &host
	}
	port := freeLoopbackPort(b)
	if err := dst.MigrateIncoming(ctx, "tcp:127.0.0.1:"+port); err != nil {
		b.Fatal(err)
	}
	if err := src.MigrateSetParameters(ctx, params); err != nil {
		b.Fatal(err)
	}
	begin := time.Now()
	if err := src.Migrate(ctx, qmp.MigrateOptions{URI: "tcp:127.0.0.1:" + port}); err != nil {
		b.Fatal(err)
	}
	for {
		mi, err := src.QueryMigrate(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if mi.Status == qmp.MigrationCompleted {
			break
		}
		if mi.Status == qmp.MigrationFailed {
			b.Fatalf("bare migration failed: %s", mi.ErrorDesc)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = src.Quit(ctx)
	_ = srcCmd.Wait()
	return time.Since(begin), guestPause(b, srcClock, dstClock)
}

// qemuTLSDir writes the files QEMU's tls-creds-x509 reads from one directory (ca-cert.pem,
// server-cert.pem and server-key.pem, client-cert.pem and client-key.pem), from a fresh CA.
func qemuTLSDir(b *testing.B) string {
	now := time.Now()
	ca, err := certs.NewCA("bench-qemu-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	write("ca-cert.pem", ca.CertPEM())
	for _, side := range []struct {
		name string
		spec certs.LeafSpec
	}{
		{"server", certs.LeafSpec{CommonName: "localhost", DNSNames: []string{"localhost"}, Server: true}},
		{"client", certs.LeafSpec{CommonName: "bench-source", Client: true}},
	} {
		leaf, err := ca.Issue(side.spec, now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		key, err := leaf.KeyPEM()
		if err != nil {
			b.Fatal(err)
		}
		write(side.name+"-cert.pem", leaf.CertPEM())
		write(side.name+"-key.pem", key)
	}
	return dir
}

// addTLSCreds adds the tls-creds-x509 object tls0 for endpoint ("server" or "client"); both ends
// verify their peer.
func addTLSCreds(b *testing.B, mon *qmp.Monitor, dir, endpoint string) {
	args := map[string]any{"qom-type": "tls-creds-x509", "id": "tls0", "dir": dir, "endpoint": endpoint, "verify-peer": true}
	if err := mon.Call(context.Background(), "object-add", args, nil); err != nil {
		b.Fatalf("object-add tls-creds-x509 (%s): %v", endpoint, err)
	}
}

func freeLoopbackPort(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// dialWhenListening connects to a QMP socket as soon as QEMU listens on it, as the launcher does.
func dialWhenListening(b testing.TB, path string) *qmp.Monitor {
	deadline := time.Now().Add(10 * time.Second)
	for {
		mon, err := qmp.Dial(context.Background(), path)
		if err == nil {
			return mon
		}
		if time.Now().After(deadline) {
			b.Fatalf("QMP at %s: %v", path, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idleSpec is the test guest's VMI without kernel or disks: 256 MiB of RAM and firmware that halts.
func idleSpec(b testing.TB) *protocol.SyncRequest {
	vmi := guestVMI(b)
	vmi.Spec.Domain.Firmware = nil
	vmi.Spec.Domain.Devices.Disks, vmi.Spec.Volumes = nil, nil
	return testutil.SyncRequest(b, vmi, nil)
}

func idleMachine(b *testing.B) *launcher.Machine { return machineFor(b, idleSpec(b)) }

// tunnelTo runs the node agents' migration endpoint and tunnel (handler/migproxy) on loopback to
// the target socket and returns the source's URI, the tunnel's socket.
func tunnelTo(b *testing.B, target string) string {
	now := time.Now()
	ca, err := certs.NewCA("bench-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	leaf, err := ca.Issue(certs.HandlerNodeSpec("bench-node"), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	data, err := certs.MaterialData(leaf, []*x509.Certificate{ca.Cert})
	if err != nil {
		b.Fatal(err)
	}
	m, err := certs.ParseMaterial(data)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := migproxy.Listen("127.0.0.1:0", certs.Fixed(m), logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go func() { _ = srv.Start(ctx) }()
	const uid = "bench-migration"
	srv.Expect(uid, target, "bench-node", 1)
	out := filepath.Join(b.TempDir(), "out.sock")
	stop, err := migproxy.NewTunnel(certs.Fixed(m), logr.Discard()).Forward(out, os.Getuid(), srv.Addr(), "bench-node", uid, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	return "unix:" + out
}

// BenchmarkBlockMigration migrates an idle 256 MiB guest with a 256 MiB emptyDisk carrying 64 MiB
// of data (written through QEMU before the migration) over loopback, uncapped: through two
// launchers (the disk mirrored to the target's NBD export, then the memory, the disk handed over
// at pre-switchover), and by hand with bare QEMU and QMP in the same run, as QEMU's own storage
// migration test does it (iotests 194): NBD export on the target, drive-mirror to it, migrate,
// block-job-cancel once the migration completed. Both measure from the start of the copy to the
// guest's arrival with its disk in sync.
func BenchmarkBlockMigration(b *testing.B) {
	var viaLauncher, bare time.Duration
	var downtime, bareDowntime int64
	for i := 0; i < b.N; i++ {
		d, dt := blockMigrateViaLaunchers(b)
		viaLauncher += d
		downtime += dt
		d, dt = blockMigrateBare(b)
		bare += d
		bareDowntime += dt
	}
	b.ReportMetric(float64(viaLauncher.Milliseconds())/float64(b.N), "launcher-ms")
	b.ReportMetric(float64(bare.Milliseconds())/float64(b.N), "bare-qemu-ms")
	b.ReportMetric(float64(viaLauncher)/float64(bare), "block-migration-ratio-vs-bare-qemu")
	b.ReportMetric(float64(downtime)/float64(b.N), "downtime-ms")
	b.ReportMetric(float64(bareDowntime)/float64(b.N), "bare-downtime-ms")
}

// blockSpec is idleSpec with a 256 MiB emptyDisk.
func blockSpec(b *testing.B) *protocol.SyncRequest {
	vmi := guestVMI(b)
	vmi.Spec.Domain.Firmware = nil
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "scratch", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
		EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("256Mi")}}}}
	return testutil.SyncRequest(b, vmi, nil)
}

// fillDisk writes 64 MiB of data at the start of the disk scratch through mon's QEMU (HMP qemu-io
// on the disk's device), as a guest would have. qemu-io reports success on QEMU's stdout and
// errors to the monitor.
func fillDisk(b *testing.B, mon *qmp.Monitor) {
	out, err := mon.HumanMonitorCommand(context.Background(), `qemu-io -d /machine/peripheral/`+launcher.DiskDeviceID("scratch")+`/virtio-backend "write -P 0xab 0 64M"`)
	if err != nil || out != "" {
		b.Fatalf("fill the disk: %v %q", err, out)
	}
}

func blockMigrateViaLaunchers(b *testing.B) (time.Duration, int64) {
	ctx := context.Background()
	const uid = "5b1ee53c-79b2-4d1c-a1c9-8d0d7d1e6b02"
	src, srcDir := benchLauncher(b, blockSpec(b), uid, false)
	shell := dialWhenListening(b, launcher.Dir(srcDir).ShellQMP())
	fillDisk(b, shell)
	_ = shell.Close()
	dst, dstDir := benchLauncher(b, blockSpec(b), uid, true)
	time.Sleep(500 * time.Millisecond)
	uri, err := dst.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	st := benchHandOver(b, src, dst, &protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: -1,
		BlockMigration: &protocol.BlockMigration{URI: "unix:" + launcher.Dir(dstDir).NBDIn()}})
	elapsed := time.Since(start)
	if st.Migration == nil || st.Migration.DiskTransferredBytes < 64<<20 {
		b.Fatalf("migration %+v: want at least 64 MiB of disk copied", st.Migration)
	}
	_ = dst.Kill(ctx)
	return elapsed, st.Migration.DowntimeMs
}

func blockMigrateBare(b *testing.B) (time.Duration, int64) {
	ctx := context.Background()
	start := func(incoming bool) *qmp.Monitor {
		m := machineFor(b, blockSpec(b))
		m.Incoming = incoming
		argv, err := launcher.BuildArgv(m)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command("qemu-system-x86_64", argv...)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		mon := dialWhenListening(b, m.QMPSocket())
		b.Cleanup(func() { _ = mon.Close() })
		return mon
	}
	src, dst := start(false), start(true)
	if err := src.Cont(ctx); err != nil {
		b.Fatal(err)
	}
	fillDisk(b, src)
	time.Sleep(500 * time.Millisecond)
	nbd := filepath.Join(b.TempDir(), "nbd.sock")
	port := freeLoopbackPort(b)
	events := []qmp.MigrationCapabilityStatus{{Capability: qmp.CapEvents, State: true}}
	for _, err := range []error{
		dst.MigrateSetCapabilities(ctx, events),
		dst.NBDServerStart(ctx, nbd, 0),
		dst.BlockExportAdd(ctx, qmp.BlockExportNBD{ID: "scratch", NodeName: launcher.DriveNode("scratch"), Writable: true, Name: "scratch"}),
		dst.MigrateIncoming(ctx, "tcp:127.0.0.1:"+port),
		src.MigrateSetCapabilities(ctx, events),
		src.MigrateSetParameters(ctx, qmp.MigrateParameters{MaxBandwidth: ptr(int64(1) << 62)}),
	} {
		if err != nil {
			b.Fatal(err)
		}
	}
	const job = "mirror-scratch"
	ready := src.NewWaiter(qmp.EventBlockJobReady, qmp.IsBlockJob(job))
	ended := src.NewWaiter("", qmp.IsBlockJobEnd(job))
	migrated := src.NewWaiter(qmp.EventMigration, migrationEnded)
	begin := time.Now()
	args := map[string]any{"job-id": job, "device": launcher.DriveNode("scratch"), "target": "nbd+unix:///scratch?socket=" + nbd,
		"format": "raw", "mode": "existing", "sync": "full"}
	if err := src.Call(ctx, "drive-mirror", args, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := ready.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	if err := src.Migrate(ctx, qmp.MigrateOptions{URI: "tcp:127.0.0.1:" + port}); err != nil {
		b.Fatal(err)
	}
	if ev, err := migrated.Wait(ctx); err != nil || ev.Data["status"] != string(qmp.MigrationCompleted) {
		b.Fatalf("bare migration ended %v %v", ev.Data, err)
	}
	if err := src.BlockJobCancel(ctx, job, false); err != nil {
		b.Fatal(err)
	}
	ev, err := ended.Wait(ctx)
	elapsed := time.Since(begin)
	if end, perr := qmp.ParseBlockJobEnd(ev); err != nil || perr != nil || end.Cancelled || end.Error != "" || end.Len < 64<<20 {
		b.Fatalf("bare mirror ended %+v %v %v", end, err, perr)
	}
	if err := dst.NBDServerStop(ctx); err != nil {
		b.Fatal(err)
	}
	waitMigrationSettled(b, src)
	mi, err := src.QueryMigrate(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return elapsed, mi.Downtime
}

func migrationEnded(ev gqmp.Event) bool {
	s := ev.Data["status"]
	return s == string(qmp.MigrationCompleted) || s == string(qmp.MigrationFailed) || s == string(qmp.MigrationCancelled)
}

// waitMigrationSettled waits until the source has left finish-migrate: QEMU 7.2 records the
// downtime after its completed event.
func waitMigrationSettled(b *testing.B, mon *qmp.Monitor) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		st, err := mon.QueryStatus(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if st.Status != qmp.StateFinishMigrate {
			return
		}
	}
}
