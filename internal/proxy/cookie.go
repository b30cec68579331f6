package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// The preview cookie a token opened once with ?agentvm_token= leaves behind
// holds no token: "v1.<claim>.<expiry>.<mac>", the claim naming the token
// (auth.Principal.Claim: "admin" or "token:<id>"), the MAC binding the
// claim, the expiry and the preview host under the proxy's key. A request
// with it is served as that token is now (auth.Service.Claimed), so a
// revoked or expired token's cookie stops working with it, a cookie read
// from a browser does not give the token itself, and a cookie copied to
// another preview host is worthless; an admin cookie ends when the admin
// token is replaced. It is HttpOnly, SameSite=Lax, and Secure when the
// proxy speaks TLS.

// cookieLifetime bounds a preview cookie (a token's own expiry, if sooner).
const cookieLifetime = 7 * 24 * time.Hour

var errBadCookie = errors.New("the preview cookie is not valid (expired, or from another host): open the URL with ?" + TokenParam + "=<token> again")

func (p *Proxy) cookieMAC(claim, exp, host string) string {
	m := hmac.New(sha256.New, p.key)
	m.Write([]byte("agentvm preview cookie\x00" + claim + "\x00" + exp + "\x00" + strings.ToLower(host)))
	if claim == "admin" {
		// The admin token has no id to revoke: its cookies are bound to
		// the token itself, and end when it is replaced.
		m.Write([]byte("\x00" + p.cfg.Auth.AdminEpoch()))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// previewCookie is the cookie for pr's token on r's host.
func (p *Proxy) previewCookie(r *http.Request, pr *auth.Principal) *http.Cookie {
	expires := time.Now().Add(cookieLifetime)
	if !pr.ExpiresAt.IsZero() && pr.ExpiresAt.Before(expires) {
		expires = pr.ExpiresAt
	}
	claim, exp := pr.Claim(), strconv.FormatInt(expires.Unix(), 10)
	return &http.Cookie{Name: cookieName, Value: "v1." + claim + "." + exp + "." + p.cookieMAC(claim, exp, r.Host),
		Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: p.cfg.TLS != nil,
		Expires: expires, MaxAge: max(int(time.Until(expires).Seconds()), 1)}
}

// cookiePrincipal is the token a preview cookie names, as it is now.
func (p *Proxy) cookiePrincipal(ctx context.Context, host, v string) (*auth.Principal, error) {
	rest, ok := strings.CutPrefix(v, "v1.")
	if !ok {
		return nil, errBadCookie
	}
	i, j := strings.IndexByte(rest, '.'), strings.LastIndexByte(rest, '.')
	if i < 0 || j <= i {
		return nil, errBadCookie
	}
	claimExp, mac := rest[:j], rest[j+1:]
	k := strings.LastIndexByte(claimExp, '.')
	claim, exp := claimExp[:k], claimExp[k+1:]
	if !hmac.Equal([]byte(mac), []byte(p.cookieMAC(claim, exp, host))) {
		return nil, errBadCookie
	}
	if e, err := strconv.ParseInt(exp, 10, 64); err != nil || time.Now().Unix() > e {
		return nil, errBadCookie
	}
	pr, err := p.cfg.Auth.Claimed(ctx, claim)
	if err != nil {
		return nil, fmt.Errorf("%w (%w)", auth.ErrUnauthenticated, err)
	}
	return pr, nil
}

// caller authenticates a preview request: a bearer token, or the preview
// cookie. ErrUnauthenticated when it carries neither.
func (p *Proxy) caller(r *http.Request) (*auth.Principal, error) {
	if sec := bearer(r); sec != "" {
		return p.cfg.Auth.Authenticate(r.Context(), sec)
	}
	if c, err := r.Cookie(cookieName); err == nil {
		return p.cookiePrincipal(r.Context(), r.Host, c.Value)
	}
	return nil, auth.ErrUnauthenticated
}
