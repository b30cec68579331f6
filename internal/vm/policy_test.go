package vm

import (
	"errors"
	"github.com/agentvm/agentvm/internal/store"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/network"
)

func TestRestartBackoff(t *testing.T) {
	want := []time.Duration{0, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for n, w := range want {
		if got := restartBackoff(n); got != w {
			t.Fatalf("backoff(%d) = %v, want %v", n, got, w)
		}
	}
	if got := restartBackoff(50); got != 5*time.Minute {
		t.Fatalf("backoff cap = %v", got)
	}
	for _, r := range []string{"", "never", "on-failure", "always"} {
		if !ValidRestart(r) {
			t.Fatalf("%q refused", r)
		}
	}
	if ValidRestart("sometimes") {
		t.Fatal("bad policy accepted")
	}
}

func TestEgressToNetwork(t *testing.T) {
	e, err := EgressToNetwork(&store.Egress{Allow: []string{"10.0.0.0/8", "203.0.113.7", "Deb.Debian.org.", "*.example.com"}, AllowHost: []int{5432}})
	if err != nil {
		t.Fatal(err)
	}
	if e.Mode != network.EgressAllow || len(e.Allow) != 2 || e.Allow[1].Bits() != 32 || len(e.Domains) != 2 ||
		e.Domains[0] != "deb.debian.org" || e.Domains[1] != "example.com" || e.AllowHost[0] != 5432 {
		t.Fatalf("converted %+v", e)
	}
	for _, bad := range []*store.Egress{{Mode: "sometimes"}, {Mode: "deny", Allow: []string{"1.2.3.4"}}, {AllowHost: []int{0}}, {Allow: []string{"not a name"}}} {
		if _, err := EgressToNetwork(bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if e, _ := EgressToNetwork(nil); e.Mode != network.EgressPublic {
		t.Fatalf("default %+v", e)
	}
}
