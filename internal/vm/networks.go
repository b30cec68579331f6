package vm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// Private networks are routed, not bridged: every VM keeps its own virtual
// network and /24; the networks of VMs on one private network route TCP to
// each other's guest address (the peer sees the connection come from its
// own gateway) and answer each other's names in DNS. Egress policies live
// in each VM's network stack on the host, out of the guest's reach.

// EgressToNetwork converts and validates an API egress policy.
func EgressToNetwork(e *store.Egress) (network.Egress, error) {
	if e == nil {
		return network.Egress{Mode: network.EgressPublic}, nil
	}
	out := network.Egress{Mode: e.Mode, AllowHost: append([]int(nil), e.AllowHost...)}
	for _, a := range e.Allow {
		a = strings.TrimSpace(a)
		if p, err := netip.ParsePrefix(a); err == nil {
			out.Allow = append(out.Allow, p)
		} else if ip, err := netip.ParseAddr(a); err == nil {
			out.Allow = append(out.Allow, netip.PrefixFrom(ip, ip.BitLen()))
		} else {
			out.Domains = append(out.Domains, a)
		}
	}
	if out.Mode == "" && (len(out.Allow) > 0 || len(out.Domains) > 0) {
		out.Mode = network.EgressAllow
	}
	if err := out.Validate(); err != nil {
		return out, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return out, nil
}

// checkEgress validates an API policy (nil is fine).
func checkEgress(e *store.Egress) error {
	if e == nil {
		return nil
	}
	_, err := EgressToNetwork(e)
	return err
}

// effectiveEgress is the VM's policy, else its network's, else public.
func (s *Service) effectiveEgress(v *store.VM) network.Egress {
	e := v.Egress
	if e == nil && v.Network != "" {
		if n, err := s.store.GetNetwork(context.Background(), v.Network); err == nil {
			e = n.Egress
		}
	}
	eg, err := EgressToNetwork(e)
	if err != nil {
		s.log.Warn("bad stored egress policy; denying egress", "vm", v.ID, "err", err)
		return network.Egress{Mode: network.EgressDeny}
	}
	return eg
}

// vmNetConfig is the network configuration of a VM: its subnet, policy and
// private-network routing.
func (s *Service) vmNetConfig(v *store.VM) network.Config {
	c := s.networkConfig(v.NetIndex)
	c.Egress = s.effectiveEgress(v)
	id := v.ID
	c.Peer = func(a netip.Addr) *network.Network { return s.peerFor(id, a) }
	c.Names = func() map[string]netip.Addr { return s.namesFor(id) }
	c.OnLimit = func(kind string, limit int) {
		s.EventData(id, "network", ActorSystem, map[string]string{"limit": kind, "max": strconv.Itoa(limit)},
			"the guest reached its limit of %d concurrent %s; more are refused", limit, limitNoun(kind))
	}
	return c
}

func limitNoun(kind string) string {
	switch kind {
	case network.LimitTCP:
		return "TCP connections"
	case network.LimitUDP:
		return "UDP flows"
	case network.LimitDNS:
		return "DNS queries"
	}
	return kind
}

// peerFor returns the network of the running VM whose guest address is a
// when it is on the same private network as the VM id.
func (s *Service) peerFor(id string, a netip.Addr) *network.Network {
	ctx := context.Background()
	me, err := s.store.GetVM(ctx, id)
	if err != nil || me.Network == "" {
		return nil
	}
	s.mu.Lock()
	var peerID string
	var peerNet *network.Network
	for pid, in := range s.instances {
		if pid != id && in.net != nil && in.net.Config().Subnet.Contains(a) {
			peerID, peerNet = pid, in.net
			break
		}
	}
	s.mu.Unlock()
	if peerNet == nil {
		return nil
	}
	if p, err := s.store.GetVM(ctx, peerID); err != nil || p.Network != me.Network {
		return nil
	}
	return peerNet
}

// namesFor maps the names of the other VMs on the VM's private network to
// their addresses.
func (s *Service) namesFor(id string) map[string]netip.Addr {
	ctx := context.Background()
	me, err := s.store.GetVM(ctx, id)
	if err != nil || me.Network == "" {
		return nil
	}
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		return nil
	}
	out := map[string]netip.Addr{}
	for _, v := range vms {
		if v.Network == me.Network && v.State != statePool {
			out[v.Name] = s.networkConfig(v.NetIndex).GuestIP()
		}
	}
	return out
}

// applyEgress pushes the VM's effective policy into its running network.
func (s *Service) applyEgress(v *store.VM) {
	if in := s.instance(v.ID); in != nil && in.net != nil {
		if err := in.net.SetEgress(s.effectiveEgress(v)); err != nil {
			s.log.Warn("apply egress policy", "vm", v.ID, "err", err)
		}
	}
}

// SetEgress replaces a VM's own egress policy (nil: follow its network's);
// it applies at once to new connections.
func (s *Service) SetEgress(ctx context.Context, idOrName string, e *store.Egress) (*store.VM, error) {
	if err := checkEgress(e); err != nil {
		return nil, err
	}
	v, err := s.GetLocal(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := s.ops.lock(v.ID, "egress")
	defer unlock()
	if v, err = s.store.GetVM(ctx, v.ID); err != nil {
		return nil, err
	}
	v.Egress = e
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return nil, err
	}
	s.applyEgress(v)
	s.logEvent(v.ID, "egress policy set: %s", describeEgress(s.effectiveEgress(v)))
	return v, nil
}

func describeEgress(e network.Egress) string {
	d := e.Mode
	if len(e.Allow) > 0 || len(e.Domains) > 0 {
		d += fmt.Sprintf(" %v %v", e.Allow, e.Domains)
	}
	if len(e.AllowHost) > 0 {
		d += fmt.Sprintf(", host ports %v", e.AllowHost)
	}
	return d
}

// SetNetwork puts a VM on a private network ("" takes it off).
func (s *Service) SetNetwork(ctx context.Context, idOrName, name string) (*store.VM, error) {
	v, err := s.GetLocal(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if name != "" {
		if _, err := s.store.GetNetwork(ctx, name); err != nil {
			return nil, fmt.Errorf("%w: no network %q", ErrNotFound, name)
		}
	}
	unlock := s.ops.lock(v.ID, "network")
	defer unlock()
	if v, err = s.store.GetVM(ctx, v.ID); err != nil {
		return nil, err
	}
	v.Network = name
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return nil, err
	}
	s.applyEgress(v)
	if name == "" {
		s.logEvent(v.ID, "left its private network")
	} else {
		s.logEvent(v.ID, "joined private network %s", name)
	}
	return v, nil
}

// CreateNetwork creates a private network.
func (s *Service) CreateNetwork(ctx context.Context, name string, e *store.Egress) (*store.Network, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := checkEgress(e); err != nil {
		return nil, err
	}
	n := &store.Network{Name: name, Egress: e, CreatedAt: time.Now().UTC()}
	if err := s.store.CreateNetwork(ctx, n); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a network named %q already exists", ErrConflict, name)
		}
		return nil, err
	}
	return n, nil
}

// NetworkMembers lists the VMs on a network.
func (s *Service) NetworkMembers(ctx context.Context, name string) ([]*store.VM, error) {
	vms, err := s.store.ListVMs(ctx)
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

// DeleteNetwork removes an empty private network.
func (s *Service) DeleteNetwork(ctx context.Context, name string) error {
	if _, err := s.store.GetNetwork(ctx, name); err != nil {
		return fmt.Errorf("%w: no network %q", ErrNotFound, name)
	}
	members, err := s.NetworkMembers(ctx, name)
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
	return s.store.DeleteNetwork(ctx, name)
}

// SetNetworkEgress changes a network's policy and applies it to its running
// VMs that have no policy of their own.
func (s *Service) SetNetworkEgress(ctx context.Context, name string, e *store.Egress) (*store.Network, error) {
	if err := checkEgress(e); err != nil {
		return nil, err
	}
	n, err := s.store.GetNetwork(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("%w: no network %q", ErrNotFound, name)
	}
	n.Egress = e
	if err := s.store.UpdateNetwork(ctx, n); err != nil {
		return nil, err
	}
	members, _ := s.NetworkMembers(ctx, name)
	for _, v := range members {
		s.applyEgress(v)
	}
	return n, nil
}

// SetDaemonListeners sets the daemon's own listen addresses, which no VM
// may reach whatever its policy (see network.Policy.Listeners). Call it
// before Reconcile.
func (s *Service) SetDaemonListeners(addrs []netip.AddrPort) {
	s.cfg.Policy.Listeners = append([]netip.AddrPort(nil), addrs...)
}
