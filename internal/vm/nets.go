package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// Networks are the named private networks VMs join, with their egress
// policies, and what makes each VM's network: its subnet, its effective
// egress policy, and the peers and names of its private network. A VM's
// own settings (its policy, the network it is on) change under its
// operation lock: Service.SetEgress and Service.SetNetwork.
type Networks struct {
	store Store
	log   *slog.Logger

	mu     sync.Mutex
	policy network.Policy // the host's (SetDaemonListeners adds the daemon's own addresses)

	// live is VM id's running network (nil: it runs none); each calls fn
	// with every running VM's id and network until fn returns false.
	live func(id string) *network.Network
	each func(fn func(id string, n *network.Network) bool)
	// serve answers a VM's connections to its service address (see
	// SetGuestServices).
	serve func(vmID string, port uint16) func(net.Conn)
	// event records a network event of VM id (its limits reached).
	event func(id string, data map[string]string, format string, args ...any)
}

// Networks returns the service's private networks.
func (s *Service) Networks() *Networks { return s.nets }

// config is the network configuration of subnet idx, without a VM's policy.
func (ns *Networks) config(idx int) network.Config {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return network.Config{Subnet: network.SubnetForIndex(idx), MAC: GuestMAC, Policy: ns.policy}
}

// open makes VM v's network.
func (ns *Networks) open(v *store.VM) (*network.Network, error) {
	return network.New(ns.vmConfig(v), ns.log.With("vm", v.ID))
}

// SetDaemonListeners sets the daemon's own listen addresses, which no VM
// may reach whatever its policy (see network.Policy.Listeners). Call it
// before Reconcile.
func (ns *Networks) SetDaemonListeners(addrs []netip.AddrPort) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.policy.Listeners = append([]netip.AddrPort(nil), addrs...)
}

// SetGuestServices makes fn answer each VM's TCP connections to its
// service address (network.Config.Serve), given the VM's id. Call it
// before Reconcile.
func (ns *Networks) SetGuestServices(fn func(vmID string, port uint16) func(net.Conn)) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.serve = fn
}

// Create creates a private network.
func (ns *Networks) Create(ctx context.Context, name string, e *store.Egress) (*store.Network, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := checkEgress(e); err != nil {
		return nil, err
	}
	n := &store.Network{Name: name, Egress: e, CreatedAt: time.Now().UTC()}
	if err := ns.store.CreateNetwork(ctx, n); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a network named %q already exists", ErrConflict, name)
		}
		return nil, err
	}
	return n, nil
}

// Members lists the VMs on a network.
func (ns *Networks) Members(ctx context.Context, name string) ([]*store.VM, error) {
	vms, err := ns.store.ListVMs(ctx)
	if err != nil {
		return nil, err
	}
	var out []*store.VM
	for _, v := range vms {
		if v.Network == name && v.State != statePool {
			out = append(out, v)
		}
	}
	return out, nil
}

// Delete removes an empty private network.
func (ns *Networks) Delete(ctx context.Context, name string) error {
	if _, err := ns.store.GetNetwork(ctx, name); err != nil {
		return fmt.Errorf("%w: no network %q", ErrNotFound, name)
	}
	members, err := ns.Members(ctx, name)
	if err != nil {
		return err
	}
	if len(members) > 0 {
		names := make([]string, 0, len(members))
		for _, m := range members {
			names = append(names, m.Name)
		}
		return fmt.Errorf("%w: network %s still has VMs: %s (detach or delete them first)", ErrConflict, name, strings.Join(names, ", "))
	}
	return ns.store.DeleteNetwork(ctx, name)
}

// SetEgress changes a network's policy and applies it to its running
// VMs that have no policy of their own.
func (ns *Networks) SetEgress(ctx context.Context, name string, e *store.Egress) (*store.Network, error) {
	if err := checkEgress(e); err != nil {
		return nil, err
	}
	n, err := ns.store.GetNetwork(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("%w: no network %q", ErrNotFound, name)
	}
	n.Egress = e
	if err := ns.store.UpdateNetwork(ctx, n); err != nil {
		return nil, err
	}
	members, _ := ns.Members(ctx, name)
	for _, v := range members {
		ns.apply(v)
	}
	return n, nil
}

// effectiveEgress is the VM's policy, else its network's, else public.
func (ns *Networks) effectiveEgress(v *store.VM) network.Egress {
	e := v.Egress
	if e == nil && v.Network != "" {
		if n, err := ns.store.GetNetwork(context.Background(), v.Network); err == nil {
			e = n.Egress
		}
	}
	eg, err := EgressToNetwork(e)
	if err != nil {
		ns.log.Warn("bad stored egress policy; denying egress", "vm", v.ID, "err", err)
		return network.Egress{Mode: network.EgressDeny}
	}
	return eg
}

// vmConfig is the network configuration of a VM: its subnet, policy and
// private-network routing.
func (ns *Networks) vmConfig(v *store.VM) network.Config {
	c := ns.config(v.NetIndex)
	c.Egress = ns.effectiveEgress(v)
	id := v.ID
	c.Peer = func(a netip.Addr) *network.Network { return ns.peerFor(id, a) }
	c.Names = func() map[string]netip.Addr { return ns.namesFor(id) }
	ns.mu.Lock()
	if serve := ns.serve; serve != nil {
		c.Serve = func(port uint16) func(net.Conn) { return serve(id, port) }
	}
	ns.mu.Unlock()
	c.OnLimit = func(kind string, limit int) {
		ns.event(id, map[string]string{"limit": kind, "max": strconv.Itoa(limit)},
			"the guest reached its limit of %d concurrent %s; more are refused", limit, limitNoun(kind))
	}
	return c
}

// peerFor returns the network of the running VM whose guest address is a
// when it is on the same private network as the VM id.
func (ns *Networks) peerFor(id string, a netip.Addr) *network.Network {
	ctx := context.Background()
	me, err := ns.store.GetVM(ctx, id)
	if err != nil || me.Network == "" {
		return nil
	}
	var peerID string
	var peerNet *network.Network
	ns.each(func(pid string, n *network.Network) bool {
		if pid != id && n.Config().Subnet.Contains(a) {
			peerID, peerNet = pid, n
			return false
		}
		return true
	})
	if peerNet == nil {
		return nil
	}
	if p, err := ns.store.GetVM(ctx, peerID); err != nil || p.Network != me.Network {
		return nil
	}
	return peerNet
}

// namesFor maps the names of the other VMs on the VM's private network to
// their addresses.
func (ns *Networks) namesFor(id string) map[string]netip.Addr {
	ctx := context.Background()
	me, err := ns.store.GetVM(ctx, id)
	if err != nil || me.Network == "" {
		return nil
	}
	vms, err := ns.store.ListVMs(ctx)
	if err != nil {
		return nil
	}
	out := map[string]netip.Addr{}
	for _, v := range vms {
		if v.Network == me.Network && v.State != statePool {
			out[v.Name] = ns.config(v.NetIndex).GuestIP()
		}
	}
	return out
}

// apply pushes the VM's effective policy into its running network.
func (ns *Networks) apply(v *store.VM) {
	if n := ns.live(v.ID); n != nil {
		if err := n.SetEgress(ns.effectiveEgress(v)); err != nil {
			ns.log.Warn("apply egress policy", "vm", v.ID, "err", err)
		}
	}
}
