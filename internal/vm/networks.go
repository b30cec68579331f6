package vm

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

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
	if v, err = s.store.GetVMFresh(ctx, v.ID); err != nil {
		return nil, err
	}
	v.Egress = e
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return nil, err
	}
	s.nets.apply(v)
	s.logEvent(v.ID, "egress policy set: %s", describeEgress(s.nets.effectiveEgress(v)))
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
	if v, err = s.store.GetVMFresh(ctx, v.ID); err != nil {
		return nil, err
	}
	v.Network = name
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return nil, err
	}
	s.nets.apply(v)
	if name == "" {
		s.logEvent(v.ID, "left its private network")
	} else {
		s.logEvent(v.ID, "joined private network %s", name)
	}
	return v, nil
}
