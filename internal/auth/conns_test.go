package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
)

// ended returns an end func for Track and a channel closed when it runs.
func ended() (func(), chan struct{}) {
	ch := make(chan struct{})
	return func() { close(ch) }, ch
}

func waitEnded(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the connection was not ended", what)
	}
}

func notEnded(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: the connection was ended", what)
	default:
	}
}

func TestTrackRevokeAndExpiry(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	login := func(req api.CreateTokenRequest) (*api.Token, *Principal) {
		t.Helper()
		tok, err := s.Create(ctx, "vmA", req)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Authenticate(ctx, tok.Secret)
		if err != nil {
			t.Fatal(err)
		}
		if p.ExpiresAt.IsZero() {
			t.Fatal("principal without expiry")
		}
		return tok, p
	}

	// revoke ends every connection of that token, not another token's
	tok, p := login(api.CreateTokenRequest{TTL: "1h"})
	_, other := login(api.CreateTokenRequest{TTL: "1h"})
	end1, ch1 := ended()
	end2, ch2 := ended()
	endO, chO := ended()
	s.Track(p, end1)
	s.Track(p, end2)
	untrackO, _ := s.Track(other, endO)
	defer untrackO()
	if err := s.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ch1, "revoke")
	waitEnded(t, ch2, "revoke")
	notEnded(t, chO, "another token's revoke")

	// a connection that registers just after the revoke is ended at once
	endLate, chLate := ended()
	s.Track(p, endLate)
	waitEnded(t, chLate, "registration after revoke")

	// a connection that ended on its own is not called back
	_, p3 := login(api.CreateTokenRequest{TTL: "1h"})
	endU, chU := ended()
	untrackU, _ := s.Track(p3, endU)
	untrackU()
	if err := s.Revoke(ctx, p3.TokenID); err != nil {
		t.Fatal(err)
	}
	notEnded(t, chU, "untracked")

	// expiry ends it without anyone asking (the TTL leaves login time to
	// a loaded machine)
	_, p4 := login(api.CreateTokenRequest{TTL: "5s"})
	endE, chE := ended()
	s.Track(p4, endE)
	waitEnded(t, chE, "expiry")
	if time.Now().Before(p4.ExpiresAt) {
		t.Fatal("ended before the expiry")
	}

	// deleting the VM ends its tokens' connections
	_, p5 := login(api.CreateTokenRequest{TTL: "1h"})
	endV, chV := ended()
	s.Track(p5, endV)
	if err := s.ForgetVM(ctx, "vmA"); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, chV, "ForgetVM")
	// a connection of that VM's token that registers just after is ended at once
	endVL, chVL := ended()
	s.Track(p5, endVL)
	waitEnded(t, chVL, "registration after ForgetVM")

	// the admin token is neither revoked nor expires: nothing is tracked
	endA, chA := ended()
	untrackA, _ := s.Track(Admin, endA)
	untrackA()
	notEnded(t, chA, "admin")
}

func TestCanAny(t *testing.T) {
	p := &Principal{TokenID: "tok_1", VMID: "vmA", Allow: []string{"preview"}}
	if err := p.CanAny("vmA", RunPerms...); !errors.Is(err, ErrForbidden) {
		t.Fatalf("preview token passes a run check: %v", err)
	}
	p.Allow = []string{"preview", "term"}
	if err := p.CanAny("vmA", RunPerms...); err != nil {
		t.Fatal(err)
	}
	if err := p.CanAny("vmB", RunPerms...); !errors.Is(err, ErrForbidden) {
		t.Fatal("another VM")
	}
	if Admin.CanAny("vmB", RunPerms...) != nil {
		t.Fatal("admin refused")
	}
}

// TestTrackCap refuses a token's connection past MaxConnsPerToken, and lets
// it in again once one ends; other tokens are not affected.
func TestTrackCap(t *testing.T) {
	r := &connRegistry{}
	now := time.Now()
	p := &Principal{TokenID: "t1"}
	var untracks []func()
	for i := 0; i < MaxConnsPerToken; i++ {
		u, err := r.add(p, now, func() {})
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		untracks = append(untracks, u)
	}
	if _, err := r.add(p, now, func() {}); err != ErrTooMany {
		t.Fatalf("past the cap: %v", err)
	}
	if _, err := r.add(&Principal{TokenID: "t2"}, now, func() {}); err != nil {
		t.Fatalf("another token: %v", err)
	}
	untracks[0]()
	if _, err := r.add(p, now, func() {}); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
}
