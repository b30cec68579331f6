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
	r.Header.Set("Cookie", cookieName+"=v1.admin.1.x; app=1")
	if got := bearer(r); got != "avt_abc" {
		t.Fatalf("bearer = %q", got)
	}
	stripToken(r)
	if r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != "app=1" {
		t.Fatalf("after strip: %v", r.Header)
	}
	// E2B keys and the token query parameter are agentvm's too.
	r = httptest.NewRequest("GET", "/p?a=1&"+TokenParam+"=avt_x", nil)
	r.Header.Set("Authorization", "Bearer e2b_0123")
	stripToken(r)
	if r.Header.Get("Authorization") != "" || r.URL.RawQuery != "a=1" {
		t.Fatalf("after strip: %v %q", r.Header, r.URL.RawQuery)
	}
	// an app's own bearer token is not agentvm's: it passes through
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer app-jwt")
	if bearer(r) != "" {
		t.Fatal("the app's token was taken for agentvm's")
	}
	stripToken(r)
	if r.Header.Get("Authorization") != "Bearer app-jwt" {
		t.Fatal("the app's Authorization header was removed")
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
