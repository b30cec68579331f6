// Package sshgw is the SSH gateway: standard SSH clients log in to a VM as
// VM@host or VM+USER@host with a scoped token as the password or a public
// key registered with a token, and get shells, exec, sftp (so scp, sftp and
// rsync work) and -L port forwarding. Nothing runs sshd in the guest: the
// gateway terminates SSH on the host and speaks to the guest agent.
package sshgw

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/record"
	"github.com/agentvm/agentvm/internal/store"
	"golang.org/x/crypto/ssh"
)

// VMs is what the gateway needs from the VM service.
type VMs interface {
	Get(ctx context.Context, idOrName string) (*store.VM, error)
	Guest(ctx context.Context, idOrName string) (*store.VM, *guest.Client, error)
	// Hold marks the VM in use until the returned func is called (idle policy).
	Hold(id string) func()
	// Event records an event in the VM's log.
	Event(vmID, typ, actor, format string, args ...any)
}

// Config configures a Gateway.
type Config struct {
	Listen      string // e.g. 127.0.0.1:2222
	HostKeyPath string // created (ed25519) when missing
	Auth        *auth.Service
	VMs         VMs
	// HostKey, when set, is the host key (a cluster's nodes share one, so
	// a client that reaches any of them sees the same); else HostKeyPath's.
	HostKey ssh.Signer
	// Forward, when set, is asked after each login whether another node
	// runs the VM; if so it returns a connection to that node that serves
	// the login as user by p there (ServePeer), and the gateway relays the
	// client's channels to it. It returns nil, nil for a VM of this node.
	// origin says where the client is (its address and SSH version).
	Forward func(ctx context.Context, vmID, user string, p *auth.Principal, origin string) (net.Conn, error)
	// AgentPath is the guest agent binary inside the VM (sftp-server mode).
	AgentPath string
	// Record, when set, records the sessions' terminals and commands.
	Record *record.Store
	Log    *slog.Logger
}

// Gateway is a running SSH gateway.
type Gateway struct {
	cfg    Config
	sshCfg *ssh.ServerConfig
	signer ssh.Signer
	ln     net.Listener
	log    *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	preauth     *preauthLimiter
	authTimeout time.Duration // authTimeout; shorter in tests
}

// LoadOrCreateHostKey reads an OpenSSH private key file, generating an
// ed25519 key there (0600) the first time.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	if b, err := os.ReadFile(path); err == nil {
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("ssh host key %s: %w", path, err)
		}
		return s, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "agentvm ssh gateway")
	if err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(blk), 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	return ssh.NewSignerFromKey(priv)
}

// New loads the host key and binds the listener.
func New(cfg Config) (*Gateway, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	signer := cfg.HostKey
	if signer == nil {
		var err error
		if signer, err = LoadOrCreateHostKey(cfg.HostKeyPath); err != nil {
			return nil, err
		}
	}
	g := &Gateway{cfg: cfg, signer: signer, log: cfg.Log, conns: map[net.Conn]struct{}{},
		preauth: newPreauthLimiter(maxUnauthenticated, maxUnauthenticatedPerIP), authTimeout: authTimeout}
	g.sshCfg = &ssh.ServerConfig{
		PasswordCallback: func(c ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) {
			return g.login(c, func(ctx context.Context, vmID string) (*auth.Principal, error) {
				return cfg.Auth.Authenticate(ctx, string(pw))
			})
		},
		PublicKeyCallback: func(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			return g.login(c, func(ctx context.Context, vmID string) (*auth.Principal, error) {
				return cfg.Auth.AuthenticateKey(ctx, vmID, key)
			})
		},
		MaxAuthTries:  6,
		ServerVersion: "SSH-2.0-agentvm",
		BannerCallback: func(c ssh.ConnMetadata) string {
			return ""
		},
	}
	g.sshCfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("ssh gateway: listen %s: %w", cfg.Listen, err)
	}
	g.ln = ln
	return g, nil
}

// Addr is the bound address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// HostKey is the gateway's public host key.
func (g *Gateway) HostKey() ssh.PublicKey { return g.signer.PublicKey() }

// Permissions extensions set at login.
const (
	extVM    = "agentvm-vm"
	extUser  = "agentvm-user"
	extToken = "agentvm-token"
)

// principalKey holds the login's *auth.Principal in Permissions.ExtraData.
type principalKey struct{}

// parseUser splits "VM" or "VM+USER".
func parseUser(s string) (vmName, user string) {
	vmName, user, _ = strings.Cut(s, "+")
	return vmName, user
}

func (g *Gateway) login(c ssh.ConnMetadata, authn func(context.Context, string) (*auth.Principal, error)) (*ssh.Permissions, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vmName, user := parseUser(c.User())
	if vmName == "" || (user != "" && !auth.ValidUser(user)) {
		return nil, fmt.Errorf("bad user name %q: log in as VM@host or VM+USER@host", c.User())
	}
	v, err := g.cfg.VMs.Get(ctx, vmName)
	if err != nil {
		g.log.Info("ssh login refused: no such VM", "user", c.User(), "remote", c.RemoteAddr().String())
		return nil, errors.New("access denied")
	}
	p, err := authn(ctx, v.ID)
	if err == nil {
		user, err = LoginUser(p, v.ID, user)
	}
	if err != nil {
		g.log.Info("ssh login refused", "user", c.User(), "vm", v.ID, "remote", c.RemoteAddr().String(), "err", err)
		return nil, errors.New("access denied")
	}
	return permissions(v.ID, user, p), nil
}

// LoginUser is the user p logs in to VM vmID as when asking for user (""
// for p's own, else root), or why p may not log in.
func LoginUser(p *auth.Principal, vmID, user string) (string, error) {
	if user != "" && !auth.ValidUser(user) {
		return "", fmt.Errorf("%w: bad user name %q", auth.ErrInvalid, user)
	}
	if err := p.Can(vmID, "ssh"); err != nil {
		return "", err
	}
	user, err := p.ActAs(user)
	if err != nil {
		return "", err
	}
	if user == "" {
		user = "root"
	}
	return user, nil
}

// permissions are a login's: the VM, the user and the caller.
func permissions(vmID, user string, p *auth.Principal) *ssh.Permissions {
	return &ssh.Permissions{Extensions: map[string]string{extVM: vmID, extUser: user, extToken: p.TokenID},
		ExtraData: map[any]any{principalKey{}: p}}
}

// Serve accepts connections until Close.
func (g *Gateway) Serve() error {
	for {
		nc, err := g.ln.Accept()
		if err != nil {
			g.mu.Lock()
			closed := g.closed
			g.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return err
		}
		src := sourceKey(nc)
		if !g.preauth.acquire(src) {
			// Refused before any SSH byte: a flood costs an accept and a close.
			g.log.Debug("ssh connection refused: too many unauthenticated connections", "remote", nc.RemoteAddr().String())
			nc.Close()
			continue
		}
		if !g.track(nc) {
			g.preauth.release(src)
			nc.Close()
			return nil
		}
		go func() {
			defer g.untrack(nc)
			g.handleConn(nc, g.sshCfg, "", func() { g.preauth.release(src) })
		}()
	}
}

// Close stops accepting and ends every connection.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	err := g.ln.Close()
	g.wg.Wait()
	return err
}

// handleConn serves one connection with cfg; authenticated is called once
// the connection has logged in or failed to. A connection with an origin
// is one another node relays (ServePeer) from the client origin names: it
// is never forwarded again, and the handler that handed it over ends it
// at a revoke.
func (g *Gateway) handleConn(nc net.Conn, cfg *ssh.ServerConfig, origin string, authenticated func()) {
	// The handshake and login must finish within the deadline. A timer, not
	// only a read deadline: a login callback that waits on the store does
	// no I/O, and the slot must come back on time anyway.
	deadline := time.AfterFunc(g.authTimeout, func() { nc.Close() })
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	timedOut := !deadline.Stop()
	authenticated()
	if err != nil {
		return
	}
	defer sc.Close()
	if timedOut {
		return
	}
	// A revoke or the expiry of the token ends the connection, with every
	// session, forward and -R listener on it (see auth.Track).
	p, _ := sc.Permissions.ExtraData[principalKey{}].(*auth.Principal)
	if origin == "" {
		untrack, err := g.cfg.Auth.Track(p, func() {
			g.log.Info("ssh connection closed: its token was revoked or expired", "vm", sc.Permissions.Extensions[extVM], "token", p.TokenID)
			sc.Close()
		})
		if err != nil {
			g.log.Warn("ssh connection refused", "vm", sc.Permissions.Extensions[extVM], "token", p.TokenID, "err", err)
			return
		}
		defer untrack()
	}
	vmID, user := sc.Permissions.Extensions[extVM], sc.Permissions.Extensions[extUser]
	who := "admin"
	if p != nil {
		who = p.Actor()
	} else if t := sc.Permissions.Extensions[extToken]; t != "" {
		who = "token:" + t
	}
	if origin == "" {
		origin = fmt.Sprintf("%s (%s)", nc.RemoteAddr(), sc.ClientVersion())
		if g.cfg.Forward != nil {
			if up, err := g.cfg.Forward(context.Background(), vmID, user, p, origin); err != nil || up != nil {
				g.forward(sc, chans, reqs, up, err)
				return
			}
		}
	}
	g.log.Info("ssh login", "vm", vmID, "user", user, "token", sc.Permissions.Extensions[extToken], "from", origin)
	defer g.cfg.VMs.Hold(vmID)()
	start := time.Now()
	g.cfg.VMs.Event(vmID, "ssh", who, "ssh session opened as %s from %s", user, origin)
	defer func() {
		g.cfg.VMs.Event(vmID, "ssh", who, "ssh session as %s closed after %s", user, time.Since(start).Round(time.Second))
	}()
	fw := &forwards{g: g, sc: sc, vmID: vmID, user: user, who: who, ls: map[string]*guest.TCPListener{}}
	defer fw.closeAll()
	go fw.serve(reqs)
	// ctx ends with the SSH connection: -L forwards then close their guest
	// side too, not only when the program in the VM hangs up.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for nch := range chans {
		switch nch.ChannelType() {
		case "session":
			ch, creqs, err := nch.Accept()
			if err != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := &session{g: g, vmID: vmID, user: user, who: who, ch: ch, env: map[string]string{}}
				s.serve(creqs)
			}()
		case "direct-tcpip":
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.directTCPIP(ctx, vmID, nch, p != nil && !p.Admin && p.User != "")
			}()
		default:
			nch.Reject(ssh.UnknownChannelType, "unsupported channel type "+nch.ChannelType())
		}
	}
}
