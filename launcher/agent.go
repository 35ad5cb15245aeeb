package launcher

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"reflect"
	"sync"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/internal/quiettimer"
	"github.com/qvirt/qvirt/launcher/guestagent"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// The guest agent watcher: one goroutine per QEMU (watchAgent) owns the connection to the guest's
// qemu-ga on the channel socket (channel.go). It connects when QEMU says the guest opened the port
// (VSERPORT_CHANGE, or query-chardev when the watcher starts); it drops the connection when the
// guest closes the port or the agent fails to answer within agentCallTimeout. While connected it
// polls the interfaces (the reply doubles as the liveness check) and the OS info every
// agentOSInfoEvery polls; Status watchers hear of a change only.
//
// KubeVirt polls the agent every 10 s for most of this. The launcher does too for a minute
// (agentFastPolls) after the agent connects, after a NIC is hot-plugged and after any reply that
// differs from the last. While the replies stay the same the interval doubles up to
// AgentPollMax, since every poll wakes the launcher, QEMU and the guest's agent for nothing new:
// an idle instance with an agent is asked once a minute, not six times.

// AgentPollInterval is how often a connected agent is asked for the guest's interfaces while
// they change; AgentPollMax is the interval they reach while they do not.
var (
	AgentPollInterval = 10 * time.Second
	AgentPollMax      = time.Minute
)

const (
	agentCallTimeout = 5 * time.Second
	// agentOSInfoEvery is in polls: the OS changes rarely (an upgrade) and the kernel on a reboot,
	// which closes and reopens the agent's port and so asks at once. While nothing changes that is
	// every 25 minutes or so.
	agentOSInfoEvery = 30
	// agentFastPolls is how many polls stay at AgentPollInterval after a change (a minute at 10 s).
	agentFastPolls = 6
	// agentMaxRetryWait bounds the polls skipped between retries of an agent that does not answer
	// (about 5 minutes at the default interval).
	agentMaxRetryWait = 32
	// qmp.Monitor's name of the event for a virtio-serial port's guest end opening or closing.
	eventVSerPortChange = "VSERPORT_CHANGE"
)

// ErrAgentNotConnected is returned for guest agent requests while no agent answers (a conflict:
// 409 on the command socket).
var ErrAgentNotConnected error = &ConflictError{Msg: "the guest agent is not connected"}

// agentState is the launcher's view of one QEMU's guest agent.
type agentState struct {
	mu     sync.Mutex
	client *guestagent.Client // nil while disconnected
	status protocol.GuestAgent
	soon   chan struct{} // pollSoon's request to the watcher
}

func newAgentState() *agentState { return &agentState{soon: make(chan struct{}, 1)} }

// watchAgent runs the watcher for p until QEMU exits. It polls only while the guest has the
// agent's port open, so that a guest without qemu-ga costs its launcher nothing (no connection
// attempt, no timer): QEMU reports each open and close (VSERPORT_CHANGE), and the state before the
// subscription comes from query-chardev.
func (l *Launcher) watchAgent(p *Process, a *agentState) {
	sub := p.Monitor().Subscribe(16)
	defer sub.Close()
	defer a.disconnect(l)
	// Subscribed first, so that no change falls between the query and the events.
	portOpen := agentPortOpen(p)
	// The intervals are read once: tests change them between launchers.
	base, most := AgentPollInterval, max(AgentPollMax, AgentPollInterval)
	// Stopped until the first poll: nothing is due while the port is closed. A timerfd, not a Go
	// timer: this is what wakes a long-idle launcher, and a Go timer's firing also wakes the
	// runtime's monitor thread (package quiettimer).
	timer := quiettimer.New()
	defer timer.Close()
	sched := newAgentSchedule(base, most)
	pollNow := portOpen
	for {
		if pollNow {
			pollNow = false
			if sched.due() {
				changed, err := a.poll(l, p, sched.full())
				switch {
				case errors.Is(err, guestagent.ErrBusy):
					// A busy client (a long freeze in progress) is not a dead agent: skip this poll.
					sched.busy()
				case err != nil:
					a.disconnect(l)
					sched.failed()
				default:
					sched.answered(changed)
				}
			}
			timer.Reset(sched.interval)
		}
		select {
		case <-p.Done():
			return
		case ev, ok := <-sub.Events():
			if !ok {
				return
			}
			open, mine := portChange(ev)
			if !mine {
				continue
			}
			portOpen = open
			if !open {
				timer.Stop()
				a.disconnect(l)
				continue
			}
			sched = newAgentSchedule(base, most) // a new agent: ask for everything, now
			pollNow = true
		case <-a.soon:
			sched.soon()
			pollNow = portOpen
		case <-timer.C:
			pollNow = portOpen
		}
	}
}

// agentSchedule is when the watcher asks the agent next: interval is the wait after this poll,
// between base (AgentPollInterval) and most (AgentPollMax); fast the polls left at base, skip the
// polls left out after failures.
type agentSchedule struct {
	base, most, interval time.Duration
	polls, failures      int
	fast, skip           int
}

// newAgentSchedule is the schedule of a new connection: everything is asked at once, then often.
func newAgentSchedule(base, most time.Duration) agentSchedule {
	return agentSchedule{base: base, most: most, interval: base, fast: agentFastPolls}
}

// due reports whether this poll asks the agent, or is one of those skipped after failures.
func (s *agentSchedule) due() bool {
	if s.skip > 0 {
		s.skip--
		return false
	}
	return true
}

// full reports whether this poll also asks for the agent's and the OS's info: the first after a
// connection, then every agentOSInfoEvery.
func (s *agentSchedule) full() bool { return s.polls%agentOSInfoEvery == 0 }

// answered follows a reply: after one that changed the status the next agentFastPolls come at
// base (an address often follows a new interface by seconds); after that the interval doubles
// with each reply, up to most.
func (s *agentSchedule) answered(changed bool) {
	s.polls++
	s.failures = 0
	if changed {
		s.fast = agentFastPolls
	}
	if s.fast > 0 {
		s.fast--
		s.interval = s.base
		return
	}
	s.interval = min(2*s.interval, s.most)
}

// busy keeps the interval: the agent is there, busy with a request of the user's.
func (s *agentSchedule) busy() {
	s.polls++
	s.failures = 0
}

// failed follows a poll that got no answer: retry at base, skipping more polls the more failures
// in a row (agentRetryWait).
func (s *agentSchedule) failed() {
	s.polls++
	s.failures++
	s.skip = agentRetryWait(s.failures)
	s.interval = s.base
}

// soon makes the next poll now and the ones after it frequent: the launcher changed the guest
// (a NIC was hot-plugged), and what the agent reports will follow.
func (s *agentSchedule) soon() {
	s.interval = s.base
	s.fast = agentFastPolls
	s.skip = 0
}

// pollSoon asks the watcher to poll now and often, when the launcher changed what the agent
// reports (a hot-plugged NIC's interface and address).
func (a *agentState) pollSoon() {
	select {
	case a.soon <- struct{}{}:
	default: // one is pending
	}
}

// agentPortOpen asks QEMU whether the guest has the agent's port open (query-chardev's
// frontend-open of the port's chardev); true when QEMU cannot say, so that the watcher tries.
func agentPortOpen(p *Process) bool {
	ctx, cancel := context.WithTimeout(context.Background(), agentCallTimeout)
	defer cancel()
	devs, err := p.Monitor().QueryChardevs(ctx)
	if err != nil {
		return true
	}
	for _, d := range devs {
		if d.Label == GuestAgentChardevID {
			return d.FrontendOpen
		}
	}
	return true
}

// agentRetryWait is how many polls to skip after the failures-th failure in a row: none after
// the first, then doubling up to agentMaxRetryWait. A guest without qemu-ga never opens the port,
// and its launcher would otherwise spend a connect and a 5 s wait every poll for nothing; a guest
// that starts its agent later says so with VSERPORT_CHANGE, which retries at once.
func agentRetryWait(failures int) int {
	if failures <= 1 {
		return 0
	}
	if failures-2 >= bits.Len(agentMaxRetryWait) {
		return agentMaxRetryWait
	}
	return min(1<<(failures-2), agentMaxRetryWait)
}

// portChange reports whether ev is a VSERPORT_CHANGE of the agent's port, and its new state.
func portChange(ev gqmp.Event) (open, mine bool) {
	if ev.Event != eventVSerPortChange {
		return false, false
	}
	id, _ := ev.Data["id"].(string)
	open, _ = ev.Data["open"].(bool)
	return open, id == GuestAgentPortID
}

// poll connects when needed and refreshes the status; full adds the agent and OS info. changed
// reports whether the status differs from before.
func (a *agentState) poll(l *Launcher, p *Process, full bool) (changed bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), agentCallTimeout)
	defer cancel()
	a.mu.Lock()
	c := a.client
	st := a.status
	a.mu.Unlock()
	if c == nil {
		if c, err = guestagent.Dial(ctx, p.Machine().GuestAgentSocket()); err != nil {
			return false, err
		}
		a.mu.Lock()
		a.client = c
		a.mu.Unlock()
		full = true
	}
	if full {
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		st.Version = info.Version
		os, err := c.OSInfo(ctx)
		var agentErr *guestagent.Error
		switch {
		case errors.As(err, &agentErr): // disabled or unsupported in this guest: no OS info
		case err != nil:
			return false, err
		default:
			st.OS = osInfo(os)
		}
	}
	ifs, err := c.Interfaces(ctx)
	var agentErr *guestagent.Error
	switch {
	case errors.As(err, &agentErr): // refused (a frozen guest allows few commands): keep the last
	case err != nil:
		return false, err
	default:
		st.Interfaces = interfaces(ifs)
	}
	st.Connected = true
	return a.set(l, st), nil
}

// set records st and tells Status watchers when it changed; it reports whether it did.
func (a *agentState) set(l *Launcher, st protocol.GuestAgent) bool {
	a.mu.Lock()
	same := reflect.DeepEqual(a.status, st)
	a.status = st
	a.mu.Unlock()
	if !same {
		l.notify()
	}
	return !same
}

// disconnect closes the connection; the guest's interfaces and OS stay as last reported
// (KubeVirt keeps them too), only Connected changes.
func (a *agentState) disconnect(l *Launcher) {
	a.mu.Lock()
	c := a.client
	a.client = nil
	st := a.status
	a.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	st.Connected = false
	a.set(l, st)
}

// snapshot is the status for Status.
func (a *agentState) snapshot() *protocol.GuestAgent {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.status
	return &st
}

func osInfo(o guestagent.OSInfo) *protocol.GuestOSInfo {
	return &protocol.GuestOSInfo{Name: o.Name, KernelRelease: o.KernelRelease, Version: o.Version,
		PrettyName: o.PrettyName, VersionID: o.VersionID, KernelVersion: o.KernelVersion, Machine: o.Machine, ID: o.ID}
}

// interfaces leaves out the loopback interface, as KubeVirt does.
func interfaces(ifs []guestagent.Interface) []protocol.GuestInterface {
	var out []protocol.GuestInterface
	for _, i := range ifs {
		if i.Name == "lo" {
			continue
		}
		gi := protocol.GuestInterface{Name: i.Name, MAC: i.MAC}
		for _, ad := range i.Addresses {
			gi.IPs = append(gi.IPs, ad.IP.String())
		}
		out = append(out, gi)
	}
	return out
}

// agentClient is the connected agent, for a request.
func (l *Launcher) agentClient() (*guestagent.Client, error) {
	l.mu.Lock()
	a := l.agent
	l.mu.Unlock()
	if a == nil {
		return nil, ErrAgentNotConnected
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client == nil {
		return nil, ErrAgentNotConnected
	}
	return a.client, nil
}

// GuestPing sends guest-ping to the guest agent: what a guestAgentPing probe asks (KubeVirt's
// virt-probe --guestAgentPing). It fails when no agent is connected or it does not answer within
// agentCallTimeout (or ctx's deadline, if sooner). A migration target waiting for the guest
// passes: the guest runs on the source until the switch-over, and a failing liveness probe here
// would have the kubelet kill the target mid-migration (KubeVirt suppresses its pings during a
// migration for the same reason).
func (l *Launcher) GuestPing(ctx context.Context) (struct{}, error) {
	if l.currentPhase() == protocol.PhaseIncoming {
		return struct{}{}, nil
	}
	c, err := l.agentClient()
	if err != nil {
		return struct{}{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	return struct{}{}, c.Ping(ctx)
}

// GuestInfo asks the agent for what KubeVirt's guestosinfo shows.
func (l *Launcher) GuestInfo(ctx context.Context) (protocol.GuestAgentInfo, error) {
	c, err := l.agentClient()
	if err != nil {
		return protocol.GuestAgentInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	var out protocol.GuestAgentInfo
	info, err := c.Info(ctx)
	if err != nil {
		return out, err
	}
	out.Version, out.SupportedCommands = info.Version, info.Commands
	os, err := c.OSInfo(ctx)
	if err != nil {
		return out, err
	}
	out.OS = *osInfo(os)
	// The rest is best effort: an agent may have these commands disabled.
	out.Hostname, _ = c.Hostname(ctx)
	out.FSFreezeStatus, _ = c.FreezeStatus(ctx)
	out.Users, _ = l.guestUsers(ctx, c)
	out.Filesystems, _ = l.guestFilesystems(ctx, c)
	return out, nil
}

// GuestUsers lists the users logged in to the guest.
func (l *Launcher) GuestUsers(ctx context.Context) ([]protocol.GuestUser, error) {
	c, err := l.agentClient()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	return l.guestUsers(ctx, c)
}

func (l *Launcher) guestUsers(ctx context.Context, c *guestagent.Client) ([]protocol.GuestUser, error) {
	us, err := c.Users(ctx)
	if err != nil {
		return nil, err
	}
	out := []protocol.GuestUser{}
	for _, u := range us {
		out = append(out, protocol.GuestUser{UserName: u.Name, Domain: u.Domain, LoginTime: u.LoginTime})
	}
	return out, nil
}

// GuestFilesystems lists the guest's mounted filesystems.
func (l *Launcher) GuestFilesystems(ctx context.Context) ([]protocol.GuestFilesystem, error) {
	c, err := l.agentClient()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	return l.guestFilesystems(ctx, c)
}

func (l *Launcher) guestFilesystems(ctx context.Context, c *guestagent.Client) ([]protocol.GuestFilesystem, error) {
	fss, err := c.Filesystems(ctx)
	if err != nil {
		return nil, err
	}
	out := []protocol.GuestFilesystem{}
	for _, f := range fss {
		g := protocol.GuestFilesystem{DiskName: f.Name, MountPoint: f.Mountpoint, FileSystemType: f.Type,
			UsedBytes: clampInt64(f.UsedBytes), TotalBytes: clampInt64(f.TotalBytes)}
		for _, d := range f.Disks {
			g.Disk = append(g.Disk, protocol.GuestFilesystemDisk{Serial: d.Serial, BusType: d.BusType})
		}
		out = append(out, g)
	}
	return out, nil
}

func clampInt64(v uint64) int64 { return int64(min(v, 1<<63-1)) }

// FSFreeze runs the agent's freeze ("freeze"), thaw ("thaw") or status ("status") command.
// Freezing can take long on a busy guest: it gets the caller's context, up to a minute.
func (l *Launcher) FSFreeze(ctx context.Context, op string) (protocol.FSFreeze, error) {
	c, err := l.agentClient()
	if err != nil {
		return protocol.FSFreeze{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out protocol.FSFreeze
	switch op {
	case "freeze":
		out.Filesystems, err = c.Freeze(ctx)
	case "thaw":
		out.Filesystems, err = c.Thaw(ctx)
	case "status":
	default:
		return out, fmt.Errorf("unknown freeze operation %q", op)
	}
	if err != nil {
		return out, err
	}
	out.Status, err = c.FreezeStatus(ctx)
	return out, err
}
