// Package console serves agentvm's web console on the API listener: the
// built single-page app (web/, embedded), the cookie sign-in that lets a
// browser call the API with an agentvm token it never sees again, and the
// headers (CSP and friends) that keep the page locked down.
package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// Authenticator maps a token to its principal (*auth.Service).
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (*auth.Principal, error)
}

// Config configures the console.
type Config struct {
	Auth Authenticator
	// Key signs CSRF tokens; nil picks a random one (sessions do not
	// outlive the process anyway).
	Key []byte
	Log *slog.Logger
	// Assets replaces the embedded build (tests); nil uses it.
	Assets fs.FS
	// IdleLifetime, MaxLifetime and MaxSessions bound the sessions (zero:
	// the package's defaults); Now is the clock (tests).
	IdleLifetime, MaxLifetime time.Duration
	MaxSessions               int
	Now                       func() time.Time
}

// Console is the web console's HTTP side.
type Console struct {
	auth   Authenticator
	key    []byte
	log    *slog.Logger
	assets fs.FS // nil: not built into this binary

	etags    map[string]string // of every asset, computed once in New
	sessions *sessions
}

// New returns the console.
func New(cfg Config) *Console {
	c := &Console{auth: cfg.Auth, key: cfg.Key, log: cfg.Log, assets: cfg.Assets, etags: map[string]string{}}
	if c.assets == nil {
		c.assets = assets()
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if len(c.key) == 0 {
		c.key = make([]byte, 32)
		if _, err := rand.Read(c.key); err != nil {
			panic("console: no randomness for the CSRF key: " + err.Error())
		}
	}
	idle, max, limit, now := cfg.IdleLifetime, cfg.MaxLifetime, cfg.MaxSessions, cfg.Now
	if idle <= 0 {
		idle = IdleLifetime
	}
	if max <= 0 {
		max = MaxLifetime
	}
	if limit <= 0 {
		limit = MaxSessions
	}
	if now == nil {
		now = time.Now
	}
	c.sessions = newSessions(idle, max, limit, now)
	c.computeETags()
	return c
}

// computeETags hashes every asset once: they are embedded and never change.
func (c *Console) computeETags() {
	if c.assets == nil {
		return
	}
	fs.WalkDir(c.assets, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := fs.ReadFile(c.assets, name)
		if err != nil {
			return nil
		}
		sum := sha256.Sum256(b)
		c.etags[name] = `"` + hex.EncodeToString(sum[:8]) + `"`
		return nil
	})
}

// Mux is where the console registers its routes (the server's recording mux).
type Mux interface {
	Handle(pattern string, h http.Handler)
}

// Routes registers the console's page, its assets and its session endpoint.
// None of them is under /v1: the API's own 404s stay as they are.
func (c *Console) Routes(mux Mux) {
	mux.Handle("GET /{$}", http.HandlerFunc(c.serveIndex))
	mux.Handle("GET /ui/", http.HandlerFunc(c.serveAsset))
	mux.Handle("GET /console/session", http.HandlerFunc(c.getSession))
	mux.Handle("POST /console/session", http.HandlerFunc(c.signIn))
	mux.Handle("DELETE /console/session", http.HandlerFunc(c.signOut))
}

// CSP is the console page's Content-Security-Policy: scripts, styles,
// fonts, images and connections from this origin only (no CDN, no inline
// script, no eval), no framing, no plugins, forms only to itself.
// 'unsafe-inline' for styles only, because xterm.js sizes and themes its
// terminal by injecting <style> elements (it has no nonce option); inline
// styles cannot run code.
// connect-src 'self' covers the page's own ws:// and wss:// (CSP Level 3).
func CSP(r *http.Request) string {
	return strings.Join([]string{
		"default-src 'none'",
		"script-src 'self'",
		"style-src 'self' 'unsafe-inline'",
		"img-src 'self' data:",
		"font-src 'self'",
		"connect-src 'self'",
		"base-uri 'none'",
		"form-action 'self'",
		"frame-ancestors 'none'",
		"object-src 'none'",
	}, "; ")
}

// pageHeaders are the headers of everything the console serves.
func pageHeaders(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP(r))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
}

const notBuilt = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentvm console not built</title></head>
<body><main>
<h1>The web console is not built into this agentvm binary</h1>
<p>The API works as usual. To get the console, build its assets and then the binary:</p>
<pre>scripts/setup.sh
# or by hand:
cd web &amp;&amp; npm ci &amp;&amp; npm run build &amp;&amp; cd .. &amp;&amp; go build -o bin/agentvm ./cmd/agentvm</pre>
<p>The build writes internal/console/dist, which <code>go build</code> embeds.</p>
</main></body></html>
`

func (c *Console) serveIndex(w http.ResponseWriter, r *http.Request) {
	pageHeaders(w, r)
	if c.assets == nil {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, notBuilt)
		return
	}
	c.serveFile(w, r, "index.html")
}

func (c *Console) serveAsset(w http.ResponseWriter, r *http.Request) {
	pageHeaders(w, r)
	name := strings.TrimPrefix(path.Clean(r.URL.Path), "/")
	if c.assets == nil || !strings.HasPrefix(name, "ui/") || strings.Contains(name, "/.") {
		http.NotFound(w, r)
		return
	}
	c.serveFile(w, r, name)
}

// serveFile serves an asset with an ETag (embedded files have no modification
// time), revalidated on every load: asset names carry no content hash.
func (c *Console) serveFile(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(c.assets, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	tag := c.etags[name]
	ctype := mime.TypeByExtension(path.Ext(name))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("ETag", tag)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
}

// Session describes a signed-in browser (GET and POST /console/session).
type Session struct {
	Admin     bool       `json:"admin"`
	TokenID   string     `json:"token_id,omitempty"`
	VMID      string     `json:"vm_id,omitempty"`
	Allow     []string   `json:"allow,omitempty"`
	User      string     `json:"user,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// CSRFToken goes in the X-CSRF-Token header of every state-changing call.
	CSRFToken string `json:"csrf_token"`
}

func (c *Console) session(p *auth.Principal, id string) Session {
	s := Session{Admin: p.Admin, TokenID: p.TokenID, VMID: p.VMID, Allow: p.Allow, User: p.User, CSRFToken: c.csrfToken(id)}
	if !p.ExpiresAt.IsZero() {
		t := p.ExpiresAt.UTC()
		s.ExpiresAt = &t
	}
	return s
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError answers in the API's error format.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	var e errorBody
	e.Error.Code, e.Error.Message = code, msg
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// getSession answers who the browser is signed in as, with the CSRF token
// (so it needs none itself, only this origin); 401 (and the cookie
// removed) when it is not signed in, or the session ended, or its token was
// revoked or expired. Any other failure (the database) keeps the cookie.
func (c *Console) getSession(w http.ResponseWriter, r *http.Request) {
	id := sessionID(r)
	if id == "" {
		writeError(w, http.StatusUnauthorized, "unauthorized", "not signed in")
		return
	}
	if err := checkOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
		return
	}
	secret, ok := c.sessions.lookup(id)
	if !ok {
		http.SetCookie(w, clearCookie(r))
		writeError(w, http.StatusUnauthorized, "unauthorized", ErrNoSession.Error())
		return
	}
	p, err := c.auth.Authenticate(r.Context(), secret)
	if err != nil {
		if errors.Is(err, auth.ErrUnauthenticated) {
			c.sessions.end(id)
			http.SetCookie(w, clearCookie(r))
			writeError(w, http.StatusUnauthorized, "unauthorized", "the session's token is no longer valid (revoked or expired): sign in again")
			return
		}
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, c.session(p, id))
}

// SignInRequest is the body of POST /console/session.
type SignInRequest struct {
	Token string `json:"token"`
}

// signIn checks a token and starts a session: the daemon keeps the token,
// the browser gets a random session id in its cookie. It is refused from
// other origins and for bodies other than JSON (which a cross-site form
// cannot send), so no other page can sign a browser in as someone else.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := checkOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "invalid", "send the token as JSON: {\"token\": \"...\"}")
		return
	}
	var req SignInRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "invalid JSON body: "+err.Error())
		return
	}
	secret := strings.TrimSpace(req.Token)
	p, err := c.auth.Authenticate(r.Context(), secret)
	if err != nil {
		if errors.Is(err, auth.ErrUnauthenticated) {
			writeError(w, http.StatusUnauthorized, "unauthorized", "invalid or expired token: use the admin token (<data dir>/admin.token) or a token from `agentvm token create VM`")
			return
		}
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	id, _, err := c.sessions.create(secret, p.ExpiresAt)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	http.SetCookie(w, sessionCookie(r, id, p.ExpiresAt))
	who := "admin"
	if !p.Admin || p.TokenID != "" {
		who = fmt.Sprintf("token %s", p.TokenID)
	}
	c.log.Info("console sign-in", "who", who, "remote", r.RemoteAddr)
	if r.TLS == nil && !loopback(r.RemoteAddr) {
		c.log.Warn("console used over plain HTTP from another host: its session cookie and the token typed at sign-in cross the network in the clear; serve it over TLS (a reverse proxy) on its own hostname", "remote", r.RemoteAddr)
	}
	writeJSON(w, http.StatusOK, c.session(p, id))
}

// loopback reports whether a remote address is this host.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// signOut ends the session, on the daemon (its id is then worthless) and
// in the browser. It needs the CSRF token, so no other page can sign the
// browser out.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if _, err := c.Credential(r); err != nil && !errors.Is(err, ErrNoSession) {
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
		return
	}
	if id := sessionID(r); id != "" {
		c.sessions.end(id)
	}
	http.SetCookie(w, clearCookie(r))
	w.WriteHeader(http.StatusNoContent)
}
