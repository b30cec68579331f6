package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// An admin token made through the API has the admin's access, can be
// listed and revoked, and a scoped token cannot make one.
func TestAdminTokenOverHTTP(t *testing.T) {
	ts := newTestServer(t, nil)
	post := func(secret, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", ts.url+"/v1/tokens", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post(testAdmin, `{}`)
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("a token without a VM, admin or e2b: %d", resp.StatusCode)
	}
	for _, body := range []string{`{"admin":true,"vm":"web"}`, `{"admin":true,"vm":"missing"}`, `{"admin":true,"e2b":true}`} {
		resp = post(testAdmin, body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Fatalf("%s: %d, want 400", body, resp.StatusCode)
		}
	}
	scoped := ts.token(t, api.CreateTokenRequest{VM: "web"})
	resp = post(scoped.Secret, `{"admin":true}`)
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("a scoped token made an admin token: %d", resp.StatusCode)
	}
	resp = post(testAdmin, `{"admin":true,"name":"lb","ttl":"24h"}`)
	var tok api.Token
	json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if resp.StatusCode != 201 || tok.Secret == "" || tok.VMID != "" {
		t.Fatalf("admin token: %d %+v", resp.StatusCode, tok)
	}
	// The admin's endpoints answer it: other tokens, the host.
	for _, path := range []string{"/v1/tokens", "/v1/host", "/v1/vms/web"} {
		r := ts.do(t, "GET", path, tok.Secret)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("GET %s with the admin token: %d", path, r.StatusCode)
		}
	}
	// It makes scoped tokens, but no admin credential that would outlive
	// its own revoke.
	resp = post(tok.Secret, `{"vm":"web","allow":["exec"]}`)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("a scoped token made with the admin token: %d", resp.StatusCode)
	}
	for _, body := range []string{`{"admin":true}`, `{"e2b":true}`} {
		resp = post(tok.Secret, body)
		resp.Body.Close()
		if resp.StatusCode != 403 {
			t.Fatalf("%s made with a stored admin token: %d, want 403", body, resp.StatusCode)
		}
	}
	c := client.New(ts.url, testAdmin)
	list, err := c.ListTokens(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		found = found || (l.ID == tok.ID && l.VMID == "" && l.Name == "lb")
	}
	if !found {
		t.Fatalf("the admin token is not listed: %+v", list)
	}
	if err := c.RevokeToken(t.Context(), tok.ID); err != nil {
		t.Fatal(err)
	}
	r := ts.do(t, "GET", "/v1/vms/web", tok.Secret)
	r.Body.Close()
	if r.StatusCode != 401 {
		t.Fatalf("a revoked admin token: %d", r.StatusCode)
	}
}
