package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// An envd access token runs anything as any user in its sandbox, so it is
// bound to the API key that was given it: "<key id>.<mac>", the mac an
// HMAC of the VM id and the key id under Config.Key. Every request that
// presents one reads that key again (auth.Claimed), so revoking or
// expiring the key, or taking exec from it, ends the envd token at once,
// and the request is tracked under the key (auth.TrackHTTP): its open
// streams end with it too. The SDKs treat the token as an opaque string.

// adminRef names the daemon's own admin token, which has no id.
const adminRef = "admin"

// errEnvdToken is a token that is not one of this sandbox's.
var errEnvdToken = errors.New("invalid or missing X-Access-Token: use the sandbox's envdAccessToken")

// keyRef is what a token for p names: its key's id.
func keyRef(p *auth.Principal) string {
	if p == nil || p.TokenID == "" {
		return adminRef
	}
	return p.TokenID
}

// The purposes of a token: envd runs anything; traffic opens the servers
// on the sandbox's loopback through its preview host (which run code too,
// so both are checked alike, but one does not open the other's door).
const (
	purposeEnvd    = "envd"
	purposeTraffic = "traffic"
)

func (s *Server) mac(purpose, vmID, ref string) string {
	m := hmac.New(sha256.New, s.cfg.Key)
	m.Write([]byte(purpose + ":" + vmID + ":" + ref))
	return hex.EncodeToString(m.Sum(nil))[:40]
}

// envdToken is the envd access token of sandbox vmID for the key of p.
func (s *Server) envdToken(vmID string, p *auth.Principal) string {
	ref := keyRef(p)
	return ref + "." + s.mac(purposeEnvd, vmID, ref)
}

// trafficToken is the traffic access token of sandbox vmID for the key of p.
func (s *Server) trafficToken(vmID string, p *auth.Principal) string {
	ref := keyRef(p)
	return ref + "." + s.mac(purposeTraffic, vmID, ref)
}

// envdPrincipal checks an envd token of sandbox vmID and returns the key it
// was given to, as that key is now. A key that is gone, expired, or no
// longer allowed to run commands in the sandbox gives an error.
func (s *Server) envdPrincipal(ctx context.Context, vmID, tok string) (*auth.Principal, error) {
	return s.tokenPrincipal(ctx, purposeEnvd, vmID, tok)
}

// tokenPrincipal checks a token of the purpose for sandbox vmID and returns
// the key it was given to, as envdPrincipal does.
func (s *Server) tokenPrincipal(ctx context.Context, purpose, vmID, tok string) (*auth.Principal, error) {
	ref, mac, ok := strings.Cut(tok, ".")
	if !ok || ref == "" || subtle.ConstantTimeCompare([]byte(mac), []byte(s.mac(purpose, vmID, ref))) != 1 {
		return nil, errEnvdToken
	}
	claim := "token:" + ref
	if ref == adminRef {
		claim = adminRef
	}
	if s.cfg.Tokens == nil {
		return nil, errEnvdToken
	}
	p, err := s.cfg.Tokens.Claimed(ctx, claim)
	if errors.Is(err, auth.ErrUnauthenticated) {
		return nil, fmt.Errorf("%w (the API key it was given to was revoked or expired)", errEnvdToken)
	}
	if err != nil {
		return nil, err
	}
	if err := mayUseEnvd(p, vmID); err != nil {
		return nil, err
	}
	return p, nil
}

// mayUseEnvd is the rule for a key that gets, or presents, an envd token:
// the one that lets it run code as any user there
// (auth.Principal.ReachesLoopback), since envd runs commands as any user.
func mayUseEnvd(p *auth.Principal, vmID string) error {
	if !p.ReachesLoopback(vmID) {
		return fmt.Errorf("%w: the API key of this envd token may no longer run commands in the sandbox", auth.ErrForbidden)
	}
	return nil
}

// envdAuthError answers a refused envd request.
func envdAuthError(w http.ResponseWriter, err error) {
	status := http.StatusUnauthorized
	switch {
	case errors.Is(err, auth.ErrForbidden):
		status = http.StatusForbidden
	case errors.Is(err, errEnvdToken), errors.Is(err, errSignature), errors.Is(err, errSignatureExpired):
	default:
		status = http.StatusServiceUnavailable
	}
	envdHTTPError(w, status, err.Error())
}

// errSignature is a signed file URL that no live key signed.
var errSignature = errors.New("invalid signature")

// errSignatureExpired is a signed file URL past its expiry, in envd's words
// (the SDKs' tests compare the whole answer).
var errSignatureExpired = errors.New("signature is already expired")

// signer checks a signed file URL (GET reads, POST writes) of sandbox vmID
// and returns the key whose envd token signed it: the signature is SHA-256
// over "path:operation:user:token[:expiration]" (signature), so each key
// that may use envd is tried, and a revoked key's URLs die with it.
func (s *Server) signer(r *http.Request, vmID string) (*auth.Principal, error) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	var exp int64
	if e := q.Get("signature_expiration"); e != "" {
		var err error
		if exp, err = strconv.ParseInt(e, 10, 64); err != nil || exp <= 0 {
			return nil, fmt.Errorf("%w: bad signature_expiration %q", errSignature, e)
		}
		if time.Now().Unix() > exp {
			return nil, errSignatureExpired
		}
	}
	keys, err := s.signers(r.Context(), vmID)
	if err != nil {
		return nil, err
	}
	got := []byte(q.Get("signature"))
	for _, p := range keys {
		want := signature(q.Get("path"), op, q.Get("username"), s.envdToken(vmID, p), exp)
		if subtle.ConstantTimeCompare(got, []byte(want)) == 1 {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w: it was not made with the envdAccessToken of a key that may still use this sandbox", errSignature)
}

// signers are the keys whose envd tokens may have signed a file URL of
// sandbox vmID: the admin, the admin keys and the sandbox's own live keys
// that may use envd. A revoked key's signatures stop working with it.
func (s *Server) signers(ctx context.Context, vmID string) ([]*auth.Principal, error) {
	out := []*auth.Principal{auth.Admin}
	ts, err := s.cfg.Tokens.Keys(ctx, vmID)
	if err != nil {
		return nil, err
	}
	for _, p := range ts {
		if mayUseEnvd(p, vmID) == nil && !slices.ContainsFunc(out, func(q *auth.Principal) bool { return q.TokenID == p.TokenID }) {
			out = append(out, p)
		}
	}
	return out, nil
}
