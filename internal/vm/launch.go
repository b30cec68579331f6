package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// A launch brings a VM's machine up: QEMU started (restoring a saved state
// or booting the disk), the network attached, the agent answering, the
// guest told who it is, and the instance published. It is a named list of
// steps run in order; each kind of launch is its own list:
//
//	restore  a create from a template, a create --from, a fork child, a wake
//	         that grew the disk: every identity step
//	boot     a start from the disk: the current device set first
//	wake     a suspend's state, nothing grown: the clock only, set by the
//	         agent from the handshake
//
// (Set in init: a step reaches launch again through publish's monitor,
// which may restart the VM.)
var restoreSteps, bootSteps, wakeSteps []launchStep

func init() {
	restoreSteps = []launchStep{
		{"network", (*launching).network},
		{"start", (*launching).start},
		{"pid", (*launching).recordPID},
		{"attach", (*launching).attach},
		{"handshake", (*launching).handshake},
		{"grow disk", (*launching).growDisk},
		{"identity", (*launching).identity},
		{"publish", (*launching).publish},
	}
	bootSteps = []launchStep{
		{"network", (*launching).network},
		{"boot devices", (*launching).bootDevices},
		{"start", (*launching).start},
		{"pid", (*launching).recordPID},
		{"attach", (*launching).attach},
		{"handshake", (*launching).handshake},
		{"grow disk", (*launching).growDisk},
		{"identity", (*launching).identity},
		{"publish", (*launching).publish},
	}
	wakeSteps = []launchStep{
		{"network", (*launching).network},
		{"start", (*launching).start},
		{"pid", (*launching).recordPID},
		{"attach", (*launching).attach},
		{"handshake", (*launching).handshake},
		{"clock", (*launching).clock},
		{"publish", (*launching).publish},
	}
}

// Kinds of identity pushed after a launch.
const (
	identityNew   = iota // a new VM: hostname, machine-id, network, clock, seed, env
	identitySame         // the same VM booted from its disk: everything but a new machine-id
	identityClock        // the same VM resumed from a suspend: only the clock moved
)

type launchOpts struct {
	agentTimeout time.Duration
	baseDisk     int64 // the disk size the guest currently sees
	identity     int
	growFS       bool // grow the guest filesystem to the disk (after an offline resize)
}

type launchStep struct {
	name string
	run  func(l *launching, ctx context.Context) error
}

// testHookStarted runs once a launch has started its machine (tests).
var testHookStarted = func(vmID string) {}

// launching is a launch in progress: what its steps made so far.
type launching struct {
	s  *Service
	v  *store.VM
	mc qemu.Config
	o  launchOpts

	t0      time.Time
	net     *network.Network
	m       Machine
	in      *instance       // from "pid" on: a failure kills it
	actx    context.Context // the agent's deadline, from the handshake on
	done    func()          // ends actx
	resize  bool            // the disk grew since the state was saved
	log     []any           // what the steps add to the "launched" line
	release func()          // ends the daemon's hold on m (unfinished), from "start" on
}

// launch runs the list of steps for the held VM's kind of launch.
func (h *held) launch(ctx context.Context, mc qemu.Config, o launchOpts) error {
	s, v := h.s, h.v
	l := &launching{s: s, v: v, mc: mc, o: o, t0: time.Now(), resize: v.DiskBytes > o.baseDisk}
	steps := restoreSteps
	switch {
	case mc.Incoming == "":
		steps = bootSteps
	case o.identity == identityClock && !l.resize && !o.growFS:
		steps = wakeSteps
	}
	defer func() {
		if l.done != nil {
			l.done()
		}
		if l.release != nil {
			l.release()
		}
	}()
	names := make([]string, 0, len(steps))
	for _, st := range steps {
		if err := st.run(l, ctx); err != nil {
			return l.fail(err)
		}
		names = append(names, st.name)
	}
	s.log.Info("launched", append([]any{"vm", v.ID, "steps", strings.Join(names, ",")}, l.log...)...)
	return nil
}

// fail undoes what the steps made: the network before there is a QEMU, the
// QEMU and network after. A QEMU that a signal ended before the guest was up
// is a crash (crashError), which a restore retries.
func (l *launching) fail(err error) error {
	if l.m == nil {
		if l.net != nil {
			l.net.Close()
		}
		if errors.Is(err, qemu.ErrExited) {
			return &crashError{err: err, unstarted: true}
		}
		return err
	}
	exited := false
	select {
	case <-l.m.Done(): // it exited on its own before the VM was up
		exited = true
	default:
	}
	if l.in != nil {
		l.in.kill()
	} else { // a step between start and pid failed
		if l.net != nil {
			l.net.Close()
		}
		l.m.Kill()
	}
	if !exited || l.s.unfinished.stopping() { // a kill of ours (the daemon stopping) is no crash to retry
		return err
	}
	if st := l.m.ExitStatus(); strings.Contains(st, "signal:") { // a crash, not an exit of its own choosing
		return &crashError{err: fmt.Errorf("%w (%s): %w", qemu.ErrExited, st, err)}
	}
	return err
}

func (l *launching) network(context.Context) error {
	net, err := l.s.nets.open(l.v)
	if err != nil {
		return err
	}
	l.net = net
	return nil
}

// bootDevices: a boot from disk gets the current device set, and memory
// plugged live becomes boot memory.
func (l *launching) bootDevices(context.Context) error {
	l.s.logEvent(l.v.ID, "cold boot from disk (accel %s)", l.s.cfg.Accel)
	l.mc.Layout, l.v.Layout = qemu.DeviceSet, qemu.DeviceSet
	l.mc.MemoryMiB, l.mc.PluggedMiB, l.v.HotMemoryMiB = l.v.MemoryMiB, 0, 0
	return nil
}

func (l *launching) start(ctx context.Context) error {
	m, err := l.s.hv.Start(ctx, l.mc)
	if err != nil && l.mc.Incoming != "" && l.mc.Layout != qemu.LegacyDeviceSet && layoutMismatch(err) {
		// A state saved by an agentvm from before vCPU hot-add (its QEMU
		// may have run on across the upgrade) needs that device set.
		lmc := l.mc
		lmc.Layout = qemu.LegacyDeviceSet
		if lm, lerr := l.s.hv.Start(ctx, lmc); lerr == nil {
			l.s.log.Info("restored a state saved with the previous device set", "vm", l.v.ID)
			m, err, l.mc, l.v.Layout = lm, nil, lmc, qemu.LegacyDeviceSet
		}
	}
	if err != nil {
		return err
	}
	l.m = m
	// A daemon that stops before the publish kills it.
	if l.release, err = l.s.unfinished.add(m); err != nil {
		return err
	}
	testHookStarted(l.v.ID)
	l.log = append(l.log, "qemu_ms", time.Since(l.t0).Milliseconds(), "restore", l.mc.Incoming != "")
	return nil
}

// recordPID records the pid at once: a daemon that dies from here on finds
// (and, for an unfinished create, removes) this QEMU at its next start.
func (l *launching) recordPID(ctx context.Context) error {
	l.v.PID = l.m.PID()
	l.s.store.UpdateVM(ctx, l.v)
	l.in = &instance{id: l.v.ID, paths: l.s.paths(l.v.ID), machine: l.m, net: l.net}
	return nil
}

// attach connects the network to QEMU's socket.
func (l *launching) attach(ctx context.Context) error {
	return attachNetwork(ctx, l.net, l.mc.NetSock, l.m)
}

// attachNetwork connects net to m's network socket. It re-dials until QEMU
// answers, and stops when QEMU exits (a crash right after the restore, a
// daemon that stops mid-build) instead of waiting out the caller's
// deadline, which a template build does not have.
func attachNetwork(ctx context.Context, net *network.Network, sock string, m Machine) error {
	ctx, cancel := untilExit(ctx, m)
	defer cancel()
	if err := net.Attach(ctx, sock); err != nil {
		return fmt.Errorf("attach network: %w", err)
	}
	return nil
}

// untilExit is ctx, also ended when m exits.
func untilExit(ctx context.Context, m Machine) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// handshake opens the agent session. In a wake the handshake carries the
// clock: an agent that sets it from there (protocol 1.1 on) needs no
// identity push.
func (l *launching) handshake(ctx context.Context) error {
	l.actx, l.done = context.WithTimeout(ctx, l.o.agentTimeout)
	setClock := l.o.identity == identityClock && !l.resize && !l.o.growFS
	agent, err := connectAgent(l.actx, l.mc.AgentSock, l.m.Done(), guest.HandshakeOptions{SetClock: setClock})
	if err != nil {
		return fmt.Errorf("%w%s", l.agentErr(ctx, err), qemu.LogTail(l.mc.LogPath))
	}
	l.in.agent = agent
	l.log = append(l.log, "agent_ms", time.Since(l.t0).Milliseconds())
	return nil
}

// agentErr names a deadline the agent missed while the caller's has not passed.
func (l *launching) agentErr(ctx context.Context, err error) error {
	if l.actx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%w: guest agent did not answer within %s (accel %s)", ErrUnavailable, l.o.agentTimeout, l.s.cfg.Accel)
	}
	return err
}

// clock ends a wake: an agent that set the clock from the handshake answers
// one round trip through the session before the VM is called awake (a
// proxied connection reaches the guest's servers without the agent), which
// also says the session works. An older agent gets the clock as an identity.
func (l *launching) clock(ctx context.Context) error {
	if !l.in.agent.ClockSent() {
		return l.identity(ctx)
	}
	t := time.Now()
	if err := l.in.agent.Ping(l.actx); err != nil {
		return fmt.Errorf("guest agent after the handshake: %w%s", l.agentErr(ctx, err), qemu.LogTail(l.mc.LogPath))
	}
	l.log = append(l.log, "ping_ms", time.Since(t).Milliseconds(), "clock", "handshake")
	return nil
}

// growDisk tells QEMU of a disk that grew since the state was saved.
func (l *launching) growDisk(ctx context.Context) error {
	if !l.resize {
		return nil
	}
	if err := l.m.BlockResize(ctx, l.v.DiskBytes); err != nil {
		return fmt.Errorf("grow disk: %w", err)
	}
	return nil
}

// identity tells the guest who it is: for a new VM everything, for a boot
// from disk everything but the machine-id, for a wake the clock.
func (l *launching) identity(ctx context.Context) error {
	t := time.Now()
	v, o := l.v, l.o
	id := guest.Identity{TimeUnixNano: time.Now().UnixNano(), DiskResize: l.resize || o.growFS}
	if o.identity != identityClock {
		nc := l.net.Config()
		id.Hostname, id.Env, id.Seed = v.Name, v.Env, []byte(randHex(32))
		id.Network = &guest.Network{Address: fmt.Sprintf("%s/%d", nc.GuestIP(), nc.Subnet.Bits()), Gateway: nc.Gateway().String(), DNS: []string{nc.Gateway().String()}}
	}
	if o.identity == identityNew {
		id.MachineID = v.MachineID
	}
	idr, err := pushIdentity(ctx, l.in, l.mc.AgentSock, l.m.Done(), id, o.agentTimeout)
	if err != nil {
		return fmt.Errorf("set guest identity: %w", err)
	}
	l.log = append(l.log, "identity_ms", time.Since(t).Milliseconds(), "guest_identity_ms", idr.MS, "steps_us", idr.StepsUS)
	return nil
}

// publish makes the instance the VM's: from here on requests reach it and
// its monitor reports its exit. A node fenced meanwhile must not run it: the
// failure kills it.
func (l *launching) publish(context.Context) error {
	now := time.Now().UTC()
	l.v.PID, l.v.StartedAt, l.v.Error = l.m.PID(), &now, "" // the caller records it running
	if !l.s.unfinished.handOver(l.m) {                      // the daemon is stopping: it was killed
		return errStopping
	}
	if !l.s.setInstance(l.v.ID, l.in) {
		return fmt.Errorf("%w: this node was fenced while the VM started (%s)", ErrUnavailable, l.s.fence.why())
	}
	go l.s.monitor(l.v.ID, l.in)
	return nil
}

// crashError is a launch whose QEMU exited on its own before the VM was up
// (a crash during or right after the state load). unstarted: it died in
// the start itself (loading the state, or at the cont that would run the
// guest), so the guest has not run.
type crashError struct {
	err       error
	unstarted bool
}

func (e *crashError) Error() string { return e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// launchOnOverlay launches the VM from a saved state on a new private overlay of
// base (v.Disk). A QEMU that crashes before the guest is up is retried once,
// in a fresh QEMU on a fresh overlay (the crashed guest may have written to
// the first), and the crash is logged with QEMU's exit status and the state
// file; only a second failure reaches the caller. A wake is retried only
// when QEMU died in its start (held.wake): its disk is the VM's own, which a
// guest that ran may have changed after the state was saved.
func (h *held) launchOnOverlay(ctx context.Context, base string, mc qemu.Config, o launchOpts) error {
	s, v := h.s, h.v
	for attempt := 1; ; attempt++ {
		if err := disk.Overlay(ctx, base, v.Disk, 0); err != nil {
			return err
		}
		err := h.launch(ctx, mc, o)
		var ce *crashError
		if err == nil || attempt == 2 || !errors.As(err, &ce) || ctx.Err() != nil {
			return err
		}
		s.log.Warn("restore crashed: qemu exited before the guest was up; retrying once in a fresh qemu", "vm", v.ID, "state", mc.Incoming, "ram", mc.RAMPath, "err", err)
		s.Event(v.ID, "lifecycle", ActorSystem, "restore from %s crashed (%v); retrying once in a fresh QEMU", mc.Incoming, err)
		if err := os.Remove(v.Disk); err != nil {
			return fmt.Errorf("restore crashed (%w) and its overlay could not be removed for the retry: %w", ce, err)
		}
	}
}

// identityTimeout bounds one identity push: ~1 s normally, even on a loaded
// TCG guest; growing the filesystem can take longer.
func identityTimeout(id guest.Identity) time.Duration {
	if id.DiskResize {
		return 5 * time.Minute
	}
	return 30 * time.Second
}

// pushIdentity applies id through in.agent. When the agent session dies
// under the request (a transport error or no answer in identityTimeout) it
// makes a new session and pushes once more: every step of an identity can be
// applied twice. An error the agent answers with is returned as it is.
func pushIdentity(ctx context.Context, in *instance, sock string, qemuDone <-chan struct{}, id guest.Identity, agentTimeout time.Duration) (*guest.IdentityResult, error) {
	for attempt := 1; ; attempt++ {
		ictx, cancel := context.WithTimeout(ctx, identityTimeout(id))
		idr, err := in.agent.ApplyIdentity(ictx, id)
		cancel()
		var ae *guest.APIError
		if err == nil || attempt == 2 || ctx.Err() != nil || errors.As(err, &ae) {
			return idr, err
		}
		in.agent.Close()
		actx, acancel := context.WithTimeout(ctx, agentTimeout)
		c, cerr := connectAgent(actx, sock, qemuDone, guest.HandshakeOptions{})
		acancel()
		if cerr != nil {
			return nil, fmt.Errorf("%w (and reconnecting to the agent: %v)", err, cerr)
		}
		in.agent = c // in is not published yet: nobody else uses it
		id.TimeUnixNano = time.Now().UnixNano()
	}
}

// layoutMismatch reports whether a restore failed because QEMU's devices
// differ from those of the saved state.
func layoutMismatch(err error) bool {
	m := err.Error()
	return strings.Contains(m, "load of migration failed") &&
		(strings.Contains(m, "Unknown savevm section") || strings.Contains(m, "Bad config data") ||
			strings.Contains(m, "error while loading state") || strings.Contains(m, "Missing section footer"))
}
