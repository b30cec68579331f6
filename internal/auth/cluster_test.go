package auth

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/agentvm/agentvm/api"
)

// What other nodes tell ends this node's connections of the token or VM
// it names, and nothing else; Resync ends those whose token the store no
// longer has; a revoke here is told to the others.
func TestHeardAndResync(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	var told []string
	s.SetBroadcast(func(_ context.Context, msg string) error { told = append(told, msg); return nil })
	track := func(vm string) (*Principal, *atomic.Bool) {
		t.Helper()
		tok, err := s.Create(ctx, vm, api.CreateTokenRequest{Allow: []string{"exec"}, TTL: "1h"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Authenticate(ctx, tok.Secret)
		if err != nil {
			t.Fatal(err)
		}
		ended := &atomic.Bool{}
		if _, err := s.Track(p, func() { ended.Store(true) }); err != nil {
			t.Fatal(err)
		}
		return p, ended
	}
	p1, end1 := track("vmA")
	_, end2 := track("vmA")
	_, end3 := track("vmB")
	s.Heard("token:" + p1.TokenID)
	if !end1.Load() || end2.Load() || end3.Load() {
		t.Fatalf("after token %s was heard: ended %v %v %v", p1.TokenID, end1.Load(), end2.Load(), end3.Load())
	}
	s.Heard("vm:vmA")
	if !end2.Load() || end3.Load() {
		t.Fatalf("after vmA was heard: ended %v %v", end2.Load(), end3.Load())
	}
	for _, junk := range []string{"", "token:", "vm", "other:vmB"} {
		s.Heard(junk)
	}
	if end3.Load() {
		t.Fatal("a message naming nothing ended a connection")
	}
	// Revoked elsewhere while nobody listened: the store no longer has it.
	p4, end4 := track("vmB")
	if err := s.store.DeleteToken(ctx, p4.TokenID); err != nil {
		t.Fatal(err)
	}
	if err := s.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	if !end4.Load() || end3.Load() {
		t.Fatalf("after a resync: ended %v (gone token) %v (live token)", end4.Load(), end3.Load())
	}
	p5, _ := track("vmC")
	if err := s.Revoke(ctx, p5.TokenID); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || told[0] != "token:"+p5.TokenID {
		t.Fatalf("a revoke here told the others %q", told)
	}
}
