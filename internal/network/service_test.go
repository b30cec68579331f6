package network

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// The service address answers ARP and hands the guest's connections to
// Config.Serve's handler for that port, whatever the egress policy; a
// port without a handler, and a network without Serve, refuse it, and its
// name resolves only when there is a Serve.
func TestServiceAddr(t *testing.T) {
	got := make(chan string, 1)
	cfg := Config{Subnet: SubnetForIndex(9), Egress: Egress{Mode: EgressDeny},
		Serve: func(port uint16) func(net.Conn) {
			if port != 80 {
				return nil
			}
			return func(c net.Conn) {
				b := make([]byte, 5)
				io.ReadFull(c, b)
				got <- string(b)
				c.Write([]byte("pong"))
			}
		}}
	n, q := setupConfig(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc := cfg.ServiceAddr()
	if svc.String() != "10.200.9.253" {
		t.Fatalf("ServiceAddr %s", svc)
	}
	c, err := q.dialTCP(ctx, netip.AddrPortFrom(svc, 80))
	if err != nil {
		t.Fatalf("dial the service address: %v", err)
	}
	c.Write([]byte("hello"))
	if s := <-got; s != "hello" {
		t.Fatalf("the handler read %q", s)
	}
	b, _ := io.ReadAll(c)
	if string(b) != "pong" {
		t.Fatalf("the guest read %q", b)
	}
	c.Close()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	if _, err := q.dialTCP(dctx, netip.AddrPortFrom(svc, 81)); err == nil || dctx.Err() != nil {
		t.Fatalf("a port without a handler: %v (want a refusal, not a timeout)", err)
	}
	uc, err := q.dialUDP(netip.AddrPortFrom(n.Gateway(), 53))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if r := dnsQuery(t, uc, GitName); len(r.Answer) != 1 || r.Answer[0].String() == "" || !containsAddr(r.Answer[0].String(), svc) {
		t.Fatalf("%s: %v", GitName, r.Answer)
	}

	// Without Serve: no name, no connection.
	n2, q2 := setupConfig(t, Config{Subnet: SubnetForIndex(10)})
	dctx2, dcancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel2()
	if _, err := q2.dialTCP(dctx2, netip.AddrPortFrom(n2.cfg.ServiceAddr(), 80)); err == nil || dctx2.Err() != nil {
		t.Fatalf("the service address without Serve: %v (want a refusal, not a timeout)", err)
	}
	uc2, err := q2.dialUDP(netip.AddrPortFrom(n2.Gateway(), 53))
	if err != nil {
		t.Fatal(err)
	}
	defer uc2.Close()
	if r := dnsQuery(t, uc2, GitName); len(r.Answer) != 0 {
		t.Fatalf("%s resolved without Serve: %v", GitName, r.Answer)
	}
}

func containsAddr(rr string, a netip.Addr) bool {
	return len(rr) >= len(a.String()) && rr[len(rr)-len(a.String()):] == a.String()
}
