package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
	"golang.org/x/crypto/ssh"
)

func newService(t *testing.T) *Service {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, "avm_admin")
}

func TestScopes(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if p, err := s.Authenticate(ctx, "avm_admin"); err != nil || !p.Admin {
		t.Fatalf("admin: %v %+v", err, p)
	}
	for _, bad := range []string{"", "avm_admi", "avt_nope", "Bearer avm_admin"} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	tok, err := s.Create(ctx, "vmA", api.CreateTokenRequest{Allow: []string{"exec", "FILES", "exec"}, User: "agent", TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.Secret, TokenPrefix) || strings.Join(tok.Allow, ",") != "exec,files" {
		t.Fatalf("token %+v", tok)
	}
	p, err := s.Authenticate(ctx, tok.Secret)
	if err != nil || p.Admin || p.VMID != "vmA" {
		t.Fatalf("scoped: %v %+v", err, p)
	}
	if p.Can("vmA", "exec") != nil || p.Can("vmA", "files") != nil {
		t.Fatal("allowed perms refused")
	}
	for _, c := range [][2]string{{"vmA", "ssh"}, {"vmA", "term"}, {"vmB", "exec"}, {"vmB", ""}} {
		if err := p.Can(c[0], c[1]); !errors.Is(err, ErrForbidden) {
			t.Fatalf("Can(%v) = %v", c, err)
		}
	}
	if u, err := p.ActAs(""); err != nil || u != "agent" {
		t.Fatalf("ActAs default: %q %v", u, err)
	}
	if _, err := p.ActAs("root"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("ActAs root: %v", err)
	}
	if u, _ := Admin.ActAs("root"); u != "root" {
		t.Fatal("admin cannot act as root")
	}
	// stored hashed: the secret is nowhere in the store
	list, _ := s.List(ctx, "")
	if len(list) != 1 || list[0].Secret != "" {
		t.Fatalf("list %+v", list)
	}
	if err := s.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, tok.Secret); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked token still works: %v", err)
	}
}

func TestExpiryAndValidation(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	tok, err := s.Create(ctx, "vmA", api.CreateTokenRequest{TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if len(tok.Allow) != len(api.AllPerms) {
		t.Fatalf("default allow %v", tok.Allow)
	}
	s.now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	if _, err := s.Authenticate(ctx, tok.Secret); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("expired token works: %v", err)
	}
	for _, req := range []api.CreateTokenRequest{
		{Allow: []string{"reboot"}}, {TTL: "-1h"}, {TTL: "soon"}, {TTL: "100000h"},
		{User: "root;rm"}, {SSHKeys: []string{"not a key"}},
	} {
		if _, err := s.Create(ctx, "vmA", req); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", req, err)
		}
	}
}

func TestSSHKeys(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	sp, _ := ssh.NewPublicKey(pub)
	so, _ := ssh.NewPublicKey(other)
	if _, err := s.Create(ctx, "vmA", api.CreateTokenRequest{Allow: []string{"ssh"}, SSHKeys: []string{string(ssh.MarshalAuthorizedKey(sp))}}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.AuthenticateKey(ctx, "vmA", sp); err != nil || p.Can("vmA", "ssh") != nil {
		t.Fatalf("key login: %v", err)
	}
	if _, err := s.AuthenticateKey(ctx, "vmB", sp); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("key for another VM: %v", err)
	}
	if _, err := s.AuthenticateKey(ctx, "vmA", so); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unregistered key: %v", err)
	}
	if err := s.ForgetVM(ctx, "vmA"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateKey(ctx, "vmA", sp); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("key of a deleted VM: %v", err)
	}
}

func TestE2BKeys(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	key, err := s.Create(ctx, "", api.CreateTokenRequest{E2B: true})
	if err != nil || !strings.HasPrefix(key.Secret, E2BPrefix) || len(key.Secret) != 44 || time.Until(key.ExpiresAt) < 300*24*time.Hour {
		t.Fatalf("admin key: %v %+v", err, key)
	}
	p, err := s.Authenticate(ctx, key.Secret)
	if err != nil || !p.Admin || p.TokenID != key.ID {
		t.Fatalf("admin key principal: %v %+v", err, p)
	}
	// Only an admin token or E2B key may lack a VM, and it takes no scope.
	for _, req := range []api.CreateTokenRequest{{}, {E2B: true, Allow: []string{"exec"}}, {E2B: true, User: "agent"}} {
		if _, err := s.Create(ctx, "", req); !errors.Is(err, ErrInvalid) {
			t.Errorf("create %+v without a VM: %v", req, err)
		}
	}
	// A VM's E2B key is an ordinary scoped token.
	vk, err := s.Create(ctx, "vmA", api.CreateTokenRequest{E2B: true})
	if err != nil || !strings.HasPrefix(vk.Secret, E2BPrefix) {
		t.Fatalf("vm key: %v %+v", err, vk)
	}
	if p, err := s.Authenticate(ctx, vk.Secret); err != nil || p.Admin || p.VMID != "vmA" {
		t.Fatalf("vm key principal: %v %+v", err, p)
	}
	// Revoking an admin key ends its open connections, and it is not capped.
	end, ch := ended()
	untrack, err := s.Track(p2(t, s, key.Secret), end)
	if err != nil {
		t.Fatal(err)
	}
	defer untrack()
	for i := 0; i < MaxConnsPerToken+1; i++ {
		if _, err := s.Track(p2(t, s, key.Secret), func() {}); err != nil {
			t.Fatalf("admin key capped at %d: %v", i, err)
		}
	}
	if err := s.Revoke(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ch, "the admin key's connection")
	if _, err := s.Authenticate(ctx, key.Secret); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked admin key: %v", err)
	}
}

// An admin token is a stored admin credential: the admin's access under
// an id of its own (which a claim names to another node), an actor of its
// own in events, revocable with its connections.
func TestAdminTokens(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	tok, err := s.Create(ctx, "", api.CreateTokenRequest{Admin: true, Name: "ci"})
	if err != nil || !strings.HasPrefix(tok.Secret, TokenPrefix) || tok.VMID != "" || tok.Name != "ci" {
		t.Fatalf("admin token: %v %+v", err, tok)
	}
	if d := time.Until(tok.ExpiresAt); d > time.Hour || d < 59*time.Minute {
		t.Fatalf("admin token's default TTL: %s, want 1h", d)
	}
	p := p2(t, s, tok.Secret)
	if !p.Admin || p.TokenID != tok.ID || p.Actor() != "admin:"+tok.ID || p.Claim() != "token:"+tok.ID {
		t.Fatalf("admin token principal: %+v actor %q claim %q", p, p.Actor(), p.Claim())
	}
	if c, err := s.Claimed(ctx, p.Claim()); err != nil || !c.Admin || c.TokenID != tok.ID {
		t.Fatalf("the admin token's claim on another node: %v %+v", err, c)
	}
	for _, req := range []api.CreateTokenRequest{
		{Admin: true, Allow: []string{"exec"}}, {Admin: true, User: "agent"},
		{Admin: true, SSHKeys: []string{"ssh-ed25519 AAAA"}},
	} {
		if _, err := s.Create(ctx, "", req); !errors.Is(err, ErrInvalid) {
			t.Errorf("create %+v: %v", req, err)
		}
	}
	if _, err := s.Create(ctx, "vmA", api.CreateTokenRequest{Admin: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an admin token for one VM: %v", err)
	}
	end, ch := ended()
	untrack, err := s.Track(p, end)
	if err != nil {
		t.Fatal(err)
	}
	defer untrack()
	if err := s.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, ch, "the admin token's connection")
	if _, err := s.Authenticate(ctx, tok.Secret); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked admin token: %v", err)
	}
	if _, err := s.Claimed(ctx, "token:"+tok.ID); err == nil {
		t.Fatal("a revoked admin token's claim still holds")
	}
}

func p2(t *testing.T, s *Service, secret string) *Principal {
	t.Helper()
	p, err := s.Authenticate(context.Background(), secret)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
