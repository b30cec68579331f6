package vm

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// instance is the live side of a running VM: its QEMU process, network and agent session.
type instance struct {
	id      string
	paths   paths
	machine Machine
	net     *network.Network

	mu       sync.Mutex
	agent    *guest.Client
	detached bool
	// expectExit is set before an exit the service causes (stop, delete), so the
	// monitor does not report a crash.
	expectExit bool
}

// guestClient returns the agent session, reconnecting when it died (for example
// after the daemon restarted or the guest agent restarted).
func (in *instance) guestClient(ctx context.Context) (*guest.Client, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.agent != nil {
		select {
		case <-in.agent.Done():
			in.agent.Close()
			in.agent = nil
		default:
			return in.agent, nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := connectAgent(cctx, in.paths.Agent, in.machine.Done(), guest.HandshakeOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: guest agent not reachable: %v", ErrUnavailable, err)
	}
	in.agent = c
	return c, nil
}

// connectAgent performs the agent handshake, giving up when QEMU exits.
func connectAgent(ctx context.Context, sock string, qemuDone <-chan struct{}, o guest.HandshakeOptions) (*guest.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-qemuDone:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := guest.Connect(ctx, sock, o)
	if err != nil {
		select {
		case <-qemuDone:
			return nil, fmt.Errorf("qemu exited before the guest agent answered")
		default:
		}
		return nil, err
	}
	return c, nil
}

// detach drops host-side connections without stopping QEMU.
func (in *instance) detach() {
	in.mu.Lock()
	in.detached = true
	if in.agent != nil {
		in.agent.Close()
		in.agent = nil
	}
	in.mu.Unlock()
	if in.net != nil {
		in.net.Close()
	}
	in.machine.Close()
}

// expect marks the coming exit as one the service causes: the monitor
// does not report it as a crash.
func (in *instance) expect() {
	in.mu.Lock()
	in.expectExit = true
	in.mu.Unlock()
}

// kill ends QEMU at once and releases everything.
func (in *instance) kill() {
	in.expect()
	if in.net != nil {
		in.net.Close() // first, so it does not try to re-dial the dying QEMU
	}
	in.machine.Kill()
	in.detach()
}

func (in *instance) expectingExit() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.expectExit || in.detached
}

// attached returns the live instance of v, or a 503 when the VM has none.
func (s *Service) attached(v *store.VM) (*instance, error) {
	in := s.instance(v.ID)
	if in == nil {
		return nil, fmt.Errorf("%w: VM %s is not attached", ErrUnavailable, v.Name)
	}
	return in, nil
}
