package sshgw

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/store"
)

// namedVMs finds a VM for every non-empty name and records the names asked for.
type namedVMs struct{ names *[]string }

func (v namedVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	*v.names = append(*v.names, ref)
	if ref == "" {
		return nil, errors.New("empty VM name")
	}
	return &store.VM{ID: "vm1", Name: ref, State: "running"}, nil
}

func (namedVMs) Guest(context.Context, string) (*store.VM, *guest.Client, error) {
	return nil, nil, errors.New("no guest agent in this test")
}

func (namedVMs) Hold(string) func()                           { return func() {} }
func (namedVMs) Event(string, string, string, string, ...any) {}

// loginMeta is the ssh.ConnMetadata of a login as user.
type loginMeta struct{ user string }

func (m loginMeta) User() string        { return m.user }
func (loginMeta) SessionID() []byte     { return []byte("session") }
func (loginMeta) ClientVersion() []byte { return []byte("SSH-2.0-fuzz") }
func (loginMeta) ServerVersion() []byte { return []byte("SSH-2.0-agentvm") }
func (loginMeta) RemoteAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000} }
func (loginMeta) LocalAddr() net.Addr   { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222} }

// FuzzLoginName logs in with arbitrary SSH user names (VM, VM+USER): a
// name is refused or names a non-empty VM and a valid guest user, the one
// the token is bound to when it is bound to one.
func FuzzLoginName(f *testing.F) {
	for _, s := range []string{
		"web", "web+alice", "vm-0123456789ab+root", "web+", "+alice", "+", "", "web+alice+bob", "web+Alice",
		"web+_svc", "web+1abc", "web+a-b.c", "web+" + strings.Repeat("a", 32), "web+" + strings.Repeat("a", 33),
		"web+al ice", "web+alice\x00", "we b", "web@host", "web+ålice", "web+root",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	var names []string
	g := &Gateway{cfg: Config{VMs: namedVMs{&names}}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f.Fuzz(func(t *testing.T, login string, bound bool) {
		names = names[:0]
		// An admin token, or a token for this VM bound to user alice.
		p := &auth.Principal{Admin: true}
		if bound {
			p = &auth.Principal{VMID: "vm1", Allow: []string{"ssh"}, User: "alice", TokenID: "tok1"}
		}
		perms, err := g.login(loginMeta{login}, func(context.Context, string) (*auth.Principal, error) { return p, nil })
		for _, n := range names {
			if n == "" || strings.Contains(n, "+") {
				t.Fatalf("login %q: looked up VM %q", login, n)
			}
		}
		if err != nil {
			return
		}
		if len(names) != 1 || perms.Extensions[extVM] != "vm1" {
			t.Fatalf("login %q: accepted for VM %q after lookups %q", login, perms.Extensions[extVM], names)
		}
		user := perms.Extensions[extUser]
		if !auth.ValidUser(user) {
			t.Fatalf("login %q: accepted as invalid user %q", login, user)
		}
		// The name is VM, VM+ or VM+USER; USER, when given, is who the session runs as.
		asked, given := strings.CutPrefix(login, names[0])
		if !given || (asked != "" && asked != "+" && asked != "+"+user) {
			t.Fatalf("login %q: accepted as VM %q user %q", login, names[0], user)
		}
		if len(asked) <= 1 && user != "root" && !bound {
			t.Fatalf("login %q without a user: got user %q, want root", login, user)
		}
		if bound && user != "alice" {
			t.Fatalf("login %q with a token bound to alice: got user %q", login, user)
		}
	})
}
