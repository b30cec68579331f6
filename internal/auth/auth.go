// Package auth owns API credentials: the admin token and scoped tokens (one
// VM, a set of permissions, optionally one guest user, an expiry), stored
// hashed, and the permission checks every entry point (REST, terminals,
// files, SSH) makes with them.
package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
	"golang.org/x/crypto/ssh"
)

var (
	// ErrUnauthenticated means no valid credential was presented.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden means the credential is valid but does not allow the action.
	ErrForbidden = errors.New("forbidden")
	// ErrInvalid means a bad token request.
	ErrInvalid = errors.New("invalid")
)

// TokenPrefix starts every scoped token; E2BPrefix starts the tokens made
// as E2B API keys.
const (
	TokenPrefix = "avt_"
	E2BPrefix   = "e2b_"
)

// AdminKeyAllow is the Allow of a stored admin key (an E2B key made without
// a VM): it acts as the admin.
const AdminKeyAllow = "admin"

// MaxTTL bounds a token's lifetime.
const MaxTTL = 365 * 24 * time.Hour

// Principal is who is calling: the admin, or the holder of a scoped token.
type Principal struct {
	Admin   bool
	TokenID string
	VMID    string
	Allow   []string
	User    string // "" = any guest user
	// ExpiresAt is when the token stops working (zero for the admin): long
	// connections opened with it are closed then (see Track).
	ExpiresAt time.Time
	// Repo is a repository token's repository (it opens no VM), Allow
	// "read" or "read","write", Branches the glob pushes must match.
	Repo     string
	Branches string
}

// Admin is the principal of the admin token.
var Admin = &Principal{Admin: true}

// Can reports whether p may use perm on the VM with id vmID.
func (p *Principal) Can(vmID, perm string) error {
	if p.Admin {
		return nil
	}
	if p.VMID != vmID || p.Repo != "" {
		return fmt.Errorf("%w: this token is for another VM", ErrForbidden)
	}
	if perm != "" && !slices.Contains(p.Allow, perm) {
		return fmt.Errorf("%w: this token does not allow %q (it allows %s)", ErrForbidden, perm, strings.Join(p.Allow, ","))
	}
	return nil
}

// Actor names p in a VM's events: "admin" (the daemon's admin token),
// "admin:<id>" (a stored admin token), "token:<id>", or "anonymous".
func (p *Principal) Actor() string {
	switch {
	case p.Admin && p.TokenID != "":
		return "admin:" + p.TokenID
	case p.Admin:
		return "admin"
	case p.TokenID != "":
		return "token:" + p.TokenID
	}
	return "anonymous"
}

// ReachesLoopback reports whether p may reach the servers that listen only
// on the VM's own loopback (the agent dials them from inside the guest):
// the admin, or exec with no user limit. Such servers trust the guest's
// users (DevTools, the code interpreter, a VNC server, a dev server's debug
// port) and run code for whoever reaches them, so nothing weaker than
// unlimited exec may.
func (p *Principal) ReachesLoopback(vmID string) bool {
	return p != nil && (p.Admin || (p.Can(vmID, api.PermExec) == nil && p.User == ""))
}

// RunPerms are the permissions that run programs in a VM. Every program the
// agent starts gets the VM's environment, and can list processes and read
// their command lines, so a token holding any of these can already learn
// the VM's env and what runs in it: the API shows those only to them.
// files counts too: a files token reads /etc/agentvm/env and can write
// files that root runs.
var RunPerms = []string{api.PermExec, api.PermTerm, api.PermSSH, api.PermFiles}

// CanAny reports whether p may use at least one of perms on the VM vmID.
func (p *Principal) CanAny(vmID string, perms ...string) error {
	if p.Admin {
		return nil
	}
	if p.VMID != vmID || p.Repo != "" {
		return fmt.Errorf("%w: this token is for another VM", ErrForbidden)
	}
	for _, perm := range perms {
		if slices.Contains(p.Allow, perm) {
			return nil
		}
	}
	return fmt.Errorf("%w: this token allows %s; this needs one of %s", ErrForbidden, strings.Join(p.Allow, ","), strings.Join(perms, ","))
}

// ActAs returns the guest user a request for user runs as: the token's user
// when the request names none, and an error when it names another one.
// Admin requests keep what they asked for ("" = the endpoint's default).
func (p *Principal) ActAs(user string) (string, error) {
	if p.Admin || p.User == "" {
		return user, nil
	}
	if user == "" || user == p.User {
		return p.User, nil
	}
	return "", fmt.Errorf("%w: this token may only act as user %q, not %q", ErrForbidden, p.User, user)
}

// Service issues and checks tokens.
type Service struct {
	store *store.Store
	admin string
	now   func() time.Time
	conns connRegistry
	// broadcast tells the other nodes of a cluster (cluster.go).
	broadcast func(ctx context.Context, msg string) error
}

// New returns a service with the given admin token.
func New(st *store.Store, adminToken string) *Service {
	return &Service{store: st, admin: adminToken, now: time.Now}
}

func hash(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// Authenticate maps a presented secret to its principal.
func (s *Service) Authenticate(ctx context.Context, secret string) (*Principal, error) {
	if secret == "" {
		return nil, ErrUnauthenticated
	}
	if subtle.ConstantTimeCompare([]byte(secret), []byte(s.admin)) == 1 {
		return Admin, nil
	}
	if !strings.HasPrefix(secret, TokenPrefix) && !strings.HasPrefix(secret, E2BPrefix) {
		return nil, ErrUnauthenticated
	}
	t, err := s.store.TokenByHash(ctx, hash(secret), s.now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, err
	}
	return principalOf(t), nil
}

func principalOf(t *store.Token) *Principal {
	if t.VMID == "" && slices.Equal(t.Allow, []string{AdminKeyAllow}) {
		return &Principal{Admin: true, TokenID: t.ID, ExpiresAt: t.ExpiresAt}
	}
	return &Principal{TokenID: t.ID, VMID: t.VMID, Allow: t.Allow, User: t.User, ExpiresAt: t.ExpiresAt, Repo: t.Repo, Branches: t.Branches}
}

// CanRepo reports whether p may read (write false) or push to (write
// true) the repository repo. The admin may; a repository token may on its
// own repository with its access; no VM token may.
func (p *Principal) CanRepo(repo string, write bool) error {
	if p.Admin {
		return nil
	}
	if p.Repo != repo {
		return fmt.Errorf("%w: this token does not open repository %s", ErrForbidden, repo)
	}
	if write && !slices.Contains(p.Allow, api.RepoWrite) {
		return fmt.Errorf("%w: this token may only read repository %s (it has no write access)", ErrForbidden, repo)
	}
	return nil
}

// Claim is how a node tells the node it forwards a request to who sent
// it: "admin" for the admin token, else "token:<id>" (the other node reads
// the token from the shared store, so an expired or revoked one fails
// there too).
func (p *Principal) Claim() string {
	if p.TokenID == "" {
		return "admin"
	}
	return "token:" + p.TokenID
}

// AdminEpoch names the admin token in force without revealing it: a
// digest that changes when the token does. Credentials derived from the
// admin token (preview cookies) bind it, so that they end with a rotation.
func (s *Service) AdminEpoch() string {
	h := sha256.Sum256([]byte("agentvm admin epoch\x00" + s.admin))
	return hex.EncodeToString(h[:12])
}

// Claimed is the principal a Claim names; only a request from another
// node (authenticated by its certificate) may carry one.
func (s *Service) Claimed(ctx context.Context, claim string) (*Principal, error) {
	if claim == "admin" {
		return Admin, nil
	}
	id, ok := strings.CutPrefix(claim, "token:")
	if !ok || id == "" {
		return nil, fmt.Errorf("%w: bad forwarded principal %q", ErrInvalid, claim)
	}
	t, err := s.store.TokenByID(ctx, id, s.now())
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, err
	}
	return principalOf(t), nil
}

// AuthenticateKey finds the principal whose token registered key for vmID.
func (s *Service) AuthenticateKey(ctx context.Context, vmID string, key ssh.PublicKey) (*Principal, error) {
	ts, err := s.store.ListTokens(ctx, vmID, s.now())
	if err != nil {
		return nil, err
	}
	want := key.Marshal()
	for _, t := range ts {
		for _, k := range t.SSHKeys {
			pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
			if err == nil && bytes.Equal(pk.Marshal(), want) {
				return principalOf(t), nil
			}
		}
	}
	return nil, ErrUnauthenticated
}

// ValidUser reports whether name can be a guest user name.
func ValidUser(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || (i > 0 && (c >= '0' && c <= '9' || c == '-' || c == '.'))) {
			return false
		}
	}
	return true
}

// Create issues a token for the VM with id vmID. The secret is only in the
// returned value.
func (s *Service) Create(ctx context.Context, vmID string, req api.CreateTokenRequest) (*api.Token, error) {
	allow := req.Allow
	if len(allow) == 0 {
		allow = api.AllPerms
	}
	adminKey := vmID == ""
	switch {
	case req.Admin && !adminKey:
		return nil, fmt.Errorf("%w: an admin token opens every VM: it names none", ErrInvalid)
	case adminKey && !req.E2B && !req.Admin:
		return nil, fmt.Errorf("%w: a token without a VM is an admin token: ask for one with admin (--admin), or e2b (--e2b) for an E2B admin key", ErrInvalid)
	case adminKey && (len(req.Allow) > 0 || req.User != "" || len(req.SSHKeys) > 0):
		return nil, fmt.Errorf("%w: an admin token has the admin's whole access: only --ttl and --name apply", ErrInvalid)
	}
	if adminKey {
		allow = nil
	}
	var clean []string
	for _, a := range allow {
		a = strings.TrimSpace(strings.ToLower(a))
		if !slices.Contains(api.AllPerms, a) {
			return nil, fmt.Errorf("%w: unknown permission %q (valid: %s)", ErrInvalid, a, strings.Join(api.AllPerms, ","))
		}
		if !slices.Contains(clean, a) {
			clean = append(clean, a)
		}
	}
	ttl := time.Hour
	if req.E2B {
		ttl = MaxTTL
	}
	ttl, err := parseTTL(req.TTL, ttl)
	if err != nil {
		return nil, err
	}
	if req.User != "" && !ValidUser(req.User) {
		return nil, fmt.Errorf("%w: user %q is not a valid user name", ErrInvalid, req.User)
	}
	if len(req.Name) > 64 {
		return nil, fmt.Errorf("%w: name is longer than 64 characters", ErrInvalid)
	}
	var keys []string
	for i, k := range req.SSHKeys {
		pk, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, fmt.Errorf("%w: ssh_keys[%d]: not a public key in authorized_keys format: %v", ErrInvalid, i, err)
		}
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
		if comment != "" {
			line += " " + comment
		}
		keys = append(keys, line)
	}
	secret, id := newSecret()
	if req.E2B {
		b := make([]byte, 20)
		rand.Read(b)
		secret = E2BPrefix + hex.EncodeToString(b)
	}
	if adminKey {
		clean = []string{AdminKeyAllow}
	}
	now := s.now().UTC()
	t := &store.Token{ID: id, Hash: hash(secret), VMID: vmID, Allow: clean, User: req.User,
		Name: req.Name, CreatedAt: now, ExpiresAt: now.Add(ttl), SSHKeys: keys}
	if err := s.store.CreateToken(ctx, t); err != nil {
		return nil, err
	}
	out := ToAPI(t)
	out.Secret = secret
	return &out, nil
}

// CreateRepo issues a token for the repository repo. The secret is only
// in the returned value.
func (s *Service) CreateRepo(ctx context.Context, repo string, req api.CreateRepoTokenRequest) (*api.Token, error) {
	allow := []string{api.RepoRead}
	switch req.Access {
	case "", api.RepoRead:
	case api.RepoWrite:
		allow = append(allow, api.RepoWrite)
	default:
		return nil, fmt.Errorf("%w: access %q: read or write", ErrInvalid, req.Access)
	}
	if err := ValidBranches(req.Branches); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if req.Branches != "" && len(allow) == 1 {
		return nil, fmt.Errorf("%w: branches limits pushes: it needs write access", ErrInvalid)
	}
	ttl, err := parseTTL(req.TTL, time.Hour)
	if err != nil {
		return nil, err
	}
	if len(req.Name) > 64 {
		return nil, fmt.Errorf("%w: name is longer than 64 characters", ErrInvalid)
	}
	secret, id := newSecret()
	now := s.now().UTC()
	t := &store.Token{ID: id, Hash: hash(secret), Allow: allow, Name: req.Name, CreatedAt: now, ExpiresAt: now.Add(ttl),
		Repo: repo, Branches: req.Branches}
	if err := s.store.CreateToken(ctx, t); err != nil {
		return nil, err
	}
	out := ToAPI(t)
	out.Secret = secret
	return &out, nil
}

// ValidBranches checks a branch glob: the characters of branch names and
// *, ? and [...], nothing that a shell pattern would take otherwise.
func ValidBranches(glob string) error {
	if len(glob) > 200 {
		return errors.New("branches: longer than 200 characters")
	}
	for _, c := range glob {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("/._-*?[]!+@", c)) {
			return fmt.Errorf("branches %q: %q cannot be in a branch glob (letters, digits, / . _ - + @ and the wildcards * ? [])", glob, c)
		}
	}
	return nil
}

// parseTTL reads a token's lifetime, def when it is "".
func parseTTL(ttl string, def time.Duration) (time.Duration, error) {
	if ttl == "" {
		return def, nil
	}
	d, err := time.ParseDuration(ttl)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: ttl %q: want a positive duration such as 30m, 1h or 720h", ErrInvalid, ttl)
	}
	if d > MaxTTL {
		return 0, fmt.Errorf("%w: ttl %s is longer than the maximum %s", ErrInvalid, d, MaxTTL)
	}
	return d, nil
}

// newSecret is a fresh token secret and id.
func newSecret() (secret, id string) {
	b := make([]byte, 24)
	rand.Read(b)
	i := make([]byte, 6)
	rand.Read(i)
	return TokenPrefix + hex.EncodeToString(b), "tok_" + hex.EncodeToString(i)
}

// Ended ends the open connections of tokens already deleted from the store
// (a repository's, deleted with it: store.DeleteRepo), here and on the
// other nodes, and keeps refusing them for the connections on their way.
func (s *Service) Ended(ctx context.Context, ids []string) {
	for _, id := range ids {
		s.conns.revoke(id, s.now())
		s.tell(ctx, "token:"+id)
	}
}

// ToAPI is the public view of a token (without its secret).
func ToAPI(t *store.Token) api.Token {
	return api.Token{ID: t.ID, VMID: t.VMID, Allow: t.Allow, User: t.User, Name: t.Name,
		CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, SSHKeys: t.SSHKeys, Repo: t.Repo, Branches: t.Branches}
}

// List returns the live tokens (of one VM when vmID is set).
func (s *Service) List(ctx context.Context, vmID string) ([]api.Token, error) {
	ts, err := s.store.ListTokens(ctx, vmID, s.now())
	if err != nil {
		return nil, err
	}
	out := make([]api.Token, 0, len(ts))
	for _, t := range ts {
		out = append(out, ToAPI(t))
	}
	return out, nil
}

// Keys are the principals of the live tokens that reach the VM vmID: its
// own and the stored admin keys.
func (s *Service) Keys(ctx context.Context, vmID string) ([]*Principal, error) {
	ts, err := s.store.ListVMTokens(ctx, vmID, s.now())
	if err != nil {
		return nil, err
	}
	var out []*Principal
	for _, t := range ts {
		if p := principalOf(t); t.VMID == vmID || (p.Admin && t.VMID == "") {
			out = append(out, p)
		}
	}
	return out, nil
}

// Revoke deletes a token; store.ErrNotFound if unknown. The connections
// opened with it (see Track) are closed too: a revoke that only stopped new
// logins would leave an attacker's open shell running.
func (s *Service) Revoke(ctx context.Context, id string) error {
	if err := s.store.DeleteToken(ctx, id); err != nil {
		return err
	}
	s.conns.revoke(id, s.now())
	s.tell(ctx, "token:"+id)
	return nil
}

// ForgetVM deletes the tokens of a deleted VM (and expired ones), and closes
// the connections opened with that VM's tokens.
func (s *Service) ForgetVM(ctx context.Context, vmID string) error {
	err := s.store.DeleteTokens(ctx, vmID, s.now())
	s.conns.forgetVM(vmID, s.now())
	s.tell(ctx, "vm:"+vmID)
	return err
}
