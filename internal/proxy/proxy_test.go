package proxy

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/auth"
)

func TestTokenHandling(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer avt_abc")
	r.Header.Set("Cookie", cookieName+"=avt_cookie; app=1")
	if got := secret(r); got != "avt_abc" {
		t.Fatalf("secret = %q", got)
	}
	stripToken(r)
	if r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != "app=1" {
		t.Fatalf("after strip: %v", r.Header)
	}
	// an app's own bearer token is not agentvm's: it passes through
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer app-jwt")
	if secret(r) != "" {
		t.Fatal("the app's token was taken for agentvm's")
	}
	stripToken(r)
	if r.Header.Get("Authorization") != "Bearer app-jwt" {
		t.Fatal("the app's Authorization header was removed")
	}
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Cookie", cookieName+"=avt_cookie")
	if secret(r) != "avt_cookie" {
		t.Fatal("cookie token")
	}
}

// The web console's session cookie (auth.SessionCookie) is agentvm's too:
// a preview on the same host must never see it.
func TestStripTokenDropsConsoleSession(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Cookie", "app=1; "+auth.SessionCookie+"=sessionid; other=2")
	stripToken(r)
	if got := r.Header.Get("Cookie"); strings.Contains(got, auth.SessionCookie) || !strings.Contains(got, "app=1") || !strings.Contains(got, "other=2") {
		t.Fatalf("after strip: Cookie %q", got)
	}
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Cookie", auth.SessionCookie+"=sessionid")
	stripToken(r)
	if got := r.Header.Get("Cookie"); got != "" {
		t.Fatalf("after strip: Cookie %q", got)
	}
}
