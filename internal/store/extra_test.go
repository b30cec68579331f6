package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestEventsRetention(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		saved := MaxEventsPerVM
		MaxEventsPerVM = 150
		defer func() { MaxEventsPerVM = saved }()
		for i := 0; i < MaxEventsPerVM+250; i++ {
			if err := s.AddEvent(ctx, &Event{VMID: "a", Time: time.Now(), Type: "exec", Message: "m"}); err != nil {
				t.Fatal(err)
			}
		}
		s.AddEvent(ctx, &Event{VMID: "b", Time: time.Now(), Type: "lifecycle", Message: "other"})
		es, err := s.ListEvents(ctx, "a", 0, 100000)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) > MaxEventsPerVM+100 || len(es) < MaxEventsPerVM {
			t.Fatalf("kept %d events", len(es))
		}
		for i := 1; i < len(es); i++ {
			if es[i].Seq <= es[i-1].Seq {
				t.Fatal("events out of order")
			}
		}
		last := es[len(es)-1].Seq
		if more, _ := s.ListEvents(ctx, "a", last, 10); len(more) != 0 {
			t.Fatalf("after the last seq: %d", len(more))
		}
		if bs, _ := s.ListEvents(ctx, "b", 0, 10); len(bs) != 1 || bs[0].Message != "other" {
			t.Fatalf("other VM: %+v", bs)
		}
	})
}

func TestPortsDomainsNetworks(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		p := &Port{VMID: "a", Port: 80, Kind: "http", Public: true, CreatedAt: time.Now()}
		if err := s.PutPort(ctx, p); err != nil {
			t.Fatal(err)
		}
		s.PutPort(ctx, &Port{VMID: "a", Port: 80, Kind: "tcp", HostAddr: "127.0.0.1", HostPort: 9999, CreatedAt: time.Now()})
		if ps, _ := s.ListPorts(ctx, "a"); len(ps) != 2 {
			t.Fatalf("ports %+v", ps)
		}
		if err := s.DeletePort(ctx, "a", 81, "http"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete missing: %v", err)
		}
		if err := s.PutDomain(ctx, &Domain{Domain: "x.test", VMID: "a", Port: 80, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutDomain(ctx, &Domain{Domain: "x.test", VMID: "b", Port: 80, CreatedAt: time.Now()}); !errors.Is(err, ErrConflict) {
			t.Fatalf("domain of another VM: %v", err)
		}
		if err := s.PutDomain(ctx, &Domain{Domain: "x.test", VMID: "a", Port: 81, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if d, _ := s.GetDomain(ctx, "x.test"); d.Port != 81 {
			t.Fatalf("domain update: %+v", d)
		}
		s.DeletePorts(ctx, "a")
		if ps, _ := s.ListPorts(ctx, "a"); len(ps) != 0 {
			t.Fatal("ports survive DeletePorts")
		}
		if _, err := s.GetDomain(ctx, "x.test"); !errors.Is(err, ErrNotFound) {
			t.Fatal("domain survives DeletePorts")
		}
		n := &Network{Name: "proj", Egress: &Egress{Mode: "deny"}, CreatedAt: time.Now()}
		if err := s.CreateNetwork(ctx, n); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateNetwork(ctx, n); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate network: %v", err)
		}
		got, err := s.GetNetwork(ctx, "proj")
		if err != nil || got.Egress.Mode != "deny" {
			t.Fatalf("network %+v %v", got, err)
		}
	})
}

func TestLatestEvents(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for i := 0; i < 10; i++ {
			vm := "a"
			if i%2 == 1 {
				vm = "b"
			}
			s.AddEvent(ctx, &Event{VMID: vm, Time: time.Now(), Type: "exec", Message: fmt.Sprint(i)})
		}
		msgs := func(es []*Event, err error) string {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range es {
				out = append(out, e.Message)
			}
			return strings.Join(out, ",")
		}
		// the newest limit, oldest first
		if got := msgs(s.LatestEvents(ctx, "", 3)); got != "7,8,9" {
			t.Fatalf("every VM's newest 3: %s", got)
		}
		if got := msgs(s.LatestEvents(ctx, "a", 2)); got != "6,8" {
			t.Fatalf("a's newest 2: %s", got)
		}
		if got := msgs(s.LatestEvents(ctx, "b", 100)); got != "1,3,5,7,9" {
			t.Fatalf("all of b's: %s", got)
		}
		if got := msgs(s.LatestEvents(ctx, "none", 5)); got != "" {
			t.Fatalf("no VM: %s", got)
		}
	})
}
