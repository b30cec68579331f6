package auth

import (
	"context"
	"strings"
)

// On a cluster a revoke (or a VM's delete) reaches one node; the
// connections of that token may be open on any node. Each node tells the
// others (SetBroadcast: a PostgreSQL NOTIFY), and ends its own on what they
// tell it (Heard). A node checks its tracked tokens against the store
// (Resync) when it starts listening and every half minute while it does,
// which ends what a lost message left open.

// SetBroadcast makes Revoke and ForgetVM tell the other nodes, through
// send, what connections to end ("token:<id>", "vm:<id>").
func (s *Service) SetBroadcast(send func(ctx context.Context, msg string) error) {
	s.broadcast = send
}

func (s *Service) tell(ctx context.Context, msg string) {
	if s.broadcast == nil {
		return
	}
	// The store already has the change: a node that misses this ends the
	// connections at its next Resync (every node resyncs while it listens,
	// see store.Listen), so a failed send does not fail the revoke; send
	// bounds and logs it.
	s.broadcast(context.WithoutCancel(ctx), msg)
}

// Heard ends the connections another node's revoke or delete names.
func (s *Service) Heard(msg string) {
	switch kind, id, _ := strings.Cut(msg, ":"); {
	case id == "":
	case kind == "token":
		s.conns.revoke(id, s.now())
	case kind == "vm":
		s.conns.forgetVM(id, s.now())
	}
}

// Resync ends the tracked connections whose token the store no longer
// has (revoked, expired, or gone with its VM) while this node could not
// hear the others.
func (s *Service) Resync(ctx context.Context) error {
	ids := s.conns.tokenIDs()
	if len(ids) == 0 {
		return nil
	}
	live, err := s.store.LiveTokens(ctx, ids, s.now())
	if err != nil {
		return err
	}
	for _, id := range ids {
		if !live[id] {
			s.conns.revoke(id, s.now())
		}
	}
	return nil
}
