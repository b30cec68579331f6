package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// CSRFHeader carries the session's CSRF token on every API call a signed-in
// browser makes with fetch (GETs included).
const CSRFHeader = "X-CSRF-Token"

// Session lifetimes and the bound on how many the daemon keeps. Sessions
// live in the daemon's memory only: a restart signs every browser out.
const (
	// IdleLifetime ends a session not used for this long.
	IdleLifetime = 12 * time.Hour
	// MaxLifetime ends a session this long after its sign-in, used or not
	// (a scoped token's session ends with the token, if sooner).
	MaxLifetime = 7 * 24 * time.Hour
	// MaxSessions bounds the sessions kept; a sign-in beyond it ends the
	// oldest.
	MaxSessions = 1000
)

var (
	// ErrCrossSite refuses a cookie-authenticated request that another site
	// (or another origin of this site, such as a preview host) made, or
	// that does not say where it comes from.
	ErrCrossSite = errors.New("cross-site request refused: the console's session cookie is only accepted from the console's own origin (the browser must send Sec-Fetch-Site: same-origin or a matching Origin)")
	// ErrCSRF refuses a cookie-authenticated request without the session's
	// CSRF token.
	ErrCSRF = errors.New("missing or wrong " + CSRFHeader + " header: a browser session must send the CSRF token from GET /console/session with every API call (only event streams, WebSocket upgrades and downloads may go without it)")
	// ErrNoSession is a session cookie the daemon does not know (signed
	// out, idle or too old, or from before a restart).
	ErrNoSession = errors.New("the console session has ended (signed out, idle for too long, too old, or the daemon restarted): sign in again")
)

// Credential returns the token of a browser request's console session ("",
// nil when it carries no session cookie), after the checks that make a
// cookie safe to accept:
//   - the request says it comes from the console's own origin:
//     Sec-Fetch-Site, when sent, is same-origin; an Origin header, when
//     present, names this host; a request with neither is refused (an old
//     browser's cross-site navigation looks like that); a WebSocket upgrade
//     must send a matching Origin (browsers always do), since SameSite alone
//     does not stop a same-site preview host (<port>-<vm>.localhost);
//   - it carries the session's CSRF token, which only a page of this origin
//     can read (GET /console/session), unless it is a GET or HEAD that a
//     page cannot add headers to: an event stream (EventSource), a
//     WebSocket upgrade or a download (a navigation);
//   - the session exists: the cookie holds a random session id, never a
//     token; the daemon maps it to the token.
//
// Bearer tokens (the CLI, SDKs) never reach this: the caller checks the
// Authorization header first.
func (c *Console) Credential(r *http.Request) (string, error) {
	id := sessionID(r)
	if id == "" {
		return "", nil
	}
	if err := checkOrigin(r); err != nil {
		return "", err
	}
	csrf := r.Header.Get(CSRFHeader)
	if csrf != "" || !safeMethod(r.Method) || !headerless(r) {
		if !c.validCSRF(id, csrf) {
			return "", ErrCSRF
		}
	}
	secret, ok := c.sessions.lookup(id)
	if !ok {
		return "", ErrNoSession
	}
	return secret, nil
}

// Sandbox sets the headers of an API answer to a browser session. The API
// relays content from VMs (files, logs) that a user may open in a tab: as
// a sandboxed document with no script, nothing a VM wrote can act with the
// console's origin and cookie. (Scripts reading the API with fetch are not
// affected: CSP applies to documents.) Nothing a session reads is cached.
func Sandbox(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// sessionID is the request's session cookie ("" when none).
func sessionID(r *http.Request) string {
	ck, err := r.Cookie(auth.SessionCookie)
	if err != nil {
		return ""
	}
	return ck.Value
}

// checkOrigin refuses requests that do not say they came from this origin.
func checkOrigin(r *http.Request) error {
	site, o := r.Header.Get("Sec-Fetch-Site"), r.Header.Get("Origin")
	if site != "" && site != "same-origin" {
		return ErrCrossSite
	}
	if o != "" && !sameOrigin(r, o) {
		return ErrCrossSite
	}
	if site == "" && o == "" {
		return ErrCrossSite
	}
	if o == "" && isWebSocket(r) {
		return ErrCrossSite
	}
	return nil
}

// headerless reports whether r is a request a page makes without being
// able to add a header: a WebSocket upgrade, an EventSource stream, or a
// navigation (a download link).
func headerless(r *http.Request) bool {
	return isWebSocket(r) ||
		strings.Contains(r.Header.Get("Accept"), "text/event-stream") ||
		r.Header.Get("Sec-Fetch-Mode") == "navigate"
}

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// sameOrigin reports whether origin (an Origin header) is the origin the
// request was sent to.
func sameOrigin(r *http.Request, origin string) bool {
	return strings.EqualFold(origin, scheme(r)+"://"+r.Host)
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// csrfToken is the CSRF token of a session: a MAC of its session id (never
// of the token) under the console's key.
func (c *Console) csrfToken(id string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("agentvm console csrf\x00"))
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Console) validCSRF(id, got string) bool {
	if got == "" {
		return false
	}
	return hmac.Equal([]byte(got), []byte(c.csrfToken(id)))
}

// sessionCookie is the cookie that holds a signed-in browser's session id:
// HttpOnly (no script reads it), SameSite=Strict (no other site's page
// sends it), Secure when the listener speaks TLS, for the whole API path
// space. It ends when the session can at the latest (a scoped token's
// expiry); otherwise it lasts for the browser session.
func sessionCookie(r *http.Request, id string, expires time.Time) *http.Cookie {
	ck := &http.Cookie{Name: auth.SessionCookie, Value: id, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
	if !expires.IsZero() {
		ck.Expires = expires
		ck.MaxAge = int(time.Until(expires).Seconds())
		if ck.MaxAge <= 0 {
			ck.MaxAge = -1
		}
	}
	return ck
}

// clearCookie deletes the session cookie.
func clearCookie(r *http.Request) *http.Cookie {
	return &http.Cookie{Name: auth.SessionCookie, Value: "", Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: -1}
}

// sessions maps session ids (by their SHA-256, so the map holds no usable
// id) to tokens, in memory only.
type sessions struct {
	idle, max time.Duration
	limit     int
	now       func() time.Time

	mu sync.Mutex
	m  map[[32]byte]*session
}

type session struct {
	secret  string
	created time.Time
	used    time.Time
	end     time.Time // absolute end: sign-in + max, or the token's expiry
}

func newSessions(idle, max time.Duration, limit int, now func() time.Time) *sessions {
	return &sessions{idle: idle, max: max, limit: limit, now: now, m: map[[32]byte]*session{}}
}

// newSessionID is 32 random bytes, base64url.
func newSessionID() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// create starts a session for secret and returns its id and absolute end.
func (s *sessions) create(secret string, tokenExpires time.Time) (string, time.Time, error) {
	id, err := newSessionID()
	if err != nil {
		return "", time.Time{}, err
	}
	now := s.now()
	se := &session{secret: secret, created: now, used: now, end: now.Add(s.max)}
	if !tokenExpires.IsZero() && tokenExpires.Before(se.end) {
		se.end = tokenExpires
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= s.limit {
		for k, v := range s.m {
			if s.expired(v, now) {
				delete(s.m, k)
			}
		}
	}
	for len(s.m) >= s.limit {
		var oldest [32]byte
		var at time.Time
		for k, v := range s.m {
			if at.IsZero() || v.created.Before(at) {
				oldest, at = k, v.created
			}
		}
		delete(s.m, oldest)
	}
	s.m[sha256.Sum256([]byte(id))] = se
	return id, se.end, nil
}

func (s *sessions) expired(se *session, now time.Time) bool {
	return !now.Before(se.end) || now.Sub(se.used) >= s.idle
}

// lookup returns a live session's token and marks it used.
func (s *sessions) lookup(id string) (string, bool) {
	k := sha256.Sum256([]byte(id))
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.m[k]
	if !ok {
		return "", false
	}
	if s.expired(se, now) {
		delete(s.m, k)
		return "", false
	}
	se.used = now
	return se.secret, true
}

// end deletes a session.
func (s *sessions) end(id string) {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
