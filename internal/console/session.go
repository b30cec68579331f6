package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// CSRFHeader carries the session's CSRF token on every state-changing call
// a signed-in browser makes.
const CSRFHeader = "X-CSRF-Token"

var (
	// ErrCrossSite refuses a cookie-authenticated request that another site
	// (or another origin of this site, such as a preview host) made.
	ErrCrossSite = errors.New("cross-site request refused: the console's session cookie is only accepted from the console's own origin")
	// ErrCSRF refuses a cookie-authenticated state-changing request without
	// the session's CSRF token.
	ErrCSRF = errors.New("missing or wrong " + CSRFHeader + " header: a browser session must send the CSRF token from GET /console/session with every POST, PUT, PATCH and DELETE")
)

// Credential returns the token a browser request carries in the console's
// session cookie ("" when it carries none), after the checks that make a
// cookie safe to accept:
//   - the request comes from the console's own origin: Sec-Fetch-Site, when
//     the browser sends it, is same-origin or none (typed by the user); an
//     Origin header, when present, names this host; a WebSocket upgrade must
//     send one (browsers always do), since SameSite alone does not stop a
//     same-site preview host (<port>-<vm>.localhost) from opening one;
//   - a state-changing method carries the session's CSRF token, which only
//     a page of this origin can read (GET /console/session).
//
// Bearer tokens (the CLI, SDKs) never reach this: the caller checks the
// Authorization header first.
func (c *Console) Credential(r *http.Request) (string, error) {
	ck, err := r.Cookie(auth.SessionCookie)
	if err != nil || ck.Value == "" {
		return "", nil
	}
	if err := checkOrigin(r); err != nil {
		return "", err
	}
	if !safeMethod(r.Method) && !c.validCSRF(ck.Value, r.Header.Get(CSRFHeader)) {
		return "", ErrCSRF
	}
	return ck.Value, nil
}

// Sandbox sets the headers of an API answer to a browser session. The API
// relays content from VMs (files, logs) that a user may open in a tab: as
// a sandboxed document with no script, nothing a VM wrote can act with the
// console's origin and cookie. (Scripts reading the API with fetch are not
// affected: CSP applies to documents.)
func Sandbox(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// checkOrigin refuses requests that did not come from this origin.
func checkOrigin(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return ErrCrossSite
	}
	o := r.Header.Get("Origin")
	if o == "" {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			return ErrCrossSite
		}
		return nil
	}
	if !sameOrigin(r, o) {
		return ErrCrossSite
	}
	return nil
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

// csrfToken is the CSRF token of a session: a MAC of its token under the
// console's key, so it needs no server-side state, survives daemon
// restarts, and changes with the token (a new sign-in, a new token).
func (c *Console) csrfToken(secret string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("agentvm console csrf\x00"))
	m.Write([]byte(secret))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Console) validCSRF(secret, got string) bool {
	if got == "" {
		return false
	}
	return hmac.Equal([]byte(got), []byte(c.csrfToken(secret)))
}

// sessionCookie is the cookie that holds a signed-in browser's token:
// HttpOnly (no script reads it), SameSite=Strict (no other site's page
// sends it), Secure when the listener speaks TLS, for the whole API path
// space. A scoped token's cookie ends when the token does; the admin's
// lasts for the browser session.
func sessionCookie(r *http.Request, secret string, expires time.Time) *http.Cookie {
	ck := &http.Cookie{Name: auth.SessionCookie, Value: secret, Path: "/", HttpOnly: true,
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
