package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Snapshots, tokens, sandboxes and the rest of networks, ports and events:
// every query of the store, on each backend.
func TestSnapshotsTokensSandboxes(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		now := time.Now()
		for i, name := range []string{"base", "snap-b"} {
			sn := &Snapshot{ID: fmt.Sprintf("snap-%d", i), Name: name, VMID: "vm-a", Layers: []string{"l1"}, CreatedAt: now.Add(time.Duration(i) * time.Second)}
			if err := s.CreateSnapshot(ctx, sn); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateSnapshot(ctx, &Snapshot{ID: "snap-9", Name: "base", CreatedAt: now}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate snapshot name: %v", err)
		}
		// An id beats a name that happens to equal it.
		if err := s.CreateSnapshot(ctx, &Snapshot{ID: "snap-2", Name: "snap-0", CreatedAt: now.Add(3 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		if sn, err := s.GetSnapshot(ctx, "snap-0"); err != nil || sn.Name != "base" {
			t.Fatalf("snapshot by id: %+v %v", sn, err)
		}
		if sn, err := s.GetSnapshot(ctx, "snap-b"); err != nil || sn.ID != "snap-1" || sn.Layers[0] != "l1" {
			t.Fatalf("snapshot by name: %+v %v", sn, err)
		}
		if _, err := s.GetSnapshot(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing snapshot: %v", err)
		}
		at := now.Add(time.Minute).UTC().Round(time.Microsecond)
		if err := s.SetSnapshotStored(ctx, "snap-0", at, "m1"); err != nil {
			t.Fatal(err)
		}
		if sn, err := s.GetSnapshot(ctx, "snap-0"); err != nil || !sn.StoredAt.Equal(at) || sn.StoredManifest != "m1" {
			t.Fatalf("stored snapshot: %+v %v", sn, err)
		}
		s.DeleteSnapshot(ctx, "snap-1")
		if err := s.SetSnapshotStored(ctx, "snap-1", at, "m1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("storing a deleted snapshot: %v", err)
		}
		if sns, err := s.ListSnapshots(ctx); err != nil || len(sns) != 2 || sns[0].ID != "snap-0" || sns[1].ID != "snap-2" {
			t.Fatalf("snapshots after a delete: %v %v", sns, err)
		}

		tok := &Token{ID: "t1", Hash: "h1", VMID: "vm-a", Allow: []string{"exec"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		old := &Token{ID: "t2", Hash: "h2", VMID: "vm-b", CreatedAt: now.Add(-2 * time.Hour), ExpiresAt: now.Add(-time.Hour)}
		for _, tk := range []*Token{tok, old} {
			if err := s.CreateToken(ctx, tk); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateToken(ctx, &Token{ID: "t3", Hash: "h1", CreatedAt: now, ExpiresAt: now}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate token hash: %v", err)
		}
		if got, err := s.TokenByHash(ctx, "h1", now); err != nil || got.ID != "t1" || got.Allow[0] != "exec" {
			t.Fatalf("token by hash: %+v %v", got, err)
		}
		if _, err := s.TokenByHash(ctx, "h2", now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("expired token found: %v", err)
		}
		if ts, _ := s.ListTokens(ctx, "", now.Add(-3*time.Hour)); len(ts) != 2 || ts[0].ID != "t2" {
			t.Fatalf("every token: %v", ts)
		}
		if ts, _ := s.ListTokens(ctx, "vm-a", now); len(ts) != 1 {
			t.Fatalf("vm-a's tokens: %v", ts)
		}
		adminKey := &Token{ID: "t4", Hash: "h4", Allow: []string{"admin"}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s.CreateToken(ctx, adminKey); err != nil {
			t.Fatal(err)
		}
		if ts, err := s.ListVMTokens(ctx, "vm-a", now); err != nil || len(ts) != 2 || ts[0].ID != "t1" || ts[1].ID != "t4" {
			t.Fatalf("vm-a's and the admin keys: %v %v", ts, err)
		}
		if ts, _ := s.ListVMTokens(ctx, "vm-b", now.Add(-3*time.Hour)); len(ts) != 2 || ts[0].ID != "t2" {
			t.Fatalf("vm-b's and the admin keys: %v", ts)
		}
		if err := s.DeleteToken(ctx, "t4"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTokens(ctx, "vm-c", now); err != nil {
			t.Fatal(err)
		}
		if ts, _ := s.ListTokens(ctx, "", now.Add(-3*time.Hour)); len(ts) != 1 {
			t.Fatalf("the expired token survives DeleteTokens: %v", ts)
		}
		if err := s.DeleteToken(ctx, "t1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteToken(ctx, "t1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete a deleted token: %v", err)
		}

		sb := &Sandbox{VMID: "vm-a", TemplateID: "base", Metadata: map[string]string{"k": "v"}, EndAt: now.Add(time.Minute), AutoPause: true, CreatedAt: now}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		sb.TemplateID, sb.AutoPause = "code", false
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.SetSandboxEnd(ctx, "vm-a", time.Time{}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetSandbox(ctx, "vm-a")
		if err != nil || got.TemplateID != "code" || got.AutoPause || !got.EndAt.IsZero() || got.Metadata["k"] != "v" {
			t.Fatalf("sandbox after an upsert: %+v %v", got, err)
		}
		if err := s.SetSandboxEnd(ctx, "vm-x", now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("end of a missing sandbox: %v", err)
		}
		if err := s.SetSandboxTimeout(ctx, "vm-x", now, time.Minute); !errors.Is(err, ErrNotFound) {
			t.Fatalf("timeout of a missing sandbox: %v", err)
		}
		s.PutSandbox(ctx, &Sandbox{VMID: "vm-b", TemplateID: "base", AutoPause: true, PauseDisk: true, AutoResume: true, PrivateTraffic: true, Timeout: 90 * time.Second, CreatedAt: now.Add(time.Second)})
		if err := s.SetSandboxTimeout(ctx, "vm-b", now.Add(time.Hour), 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if sbs, _ := s.ListSandboxes(ctx); len(sbs) != 2 || sbs[0].VMID != "vm-b" || !sbs[0].AutoPause || !sbs[0].PauseDisk || !sbs[0].AutoResume || !sbs[0].PrivateTraffic ||
			sbs[0].Timeout != 2*time.Minute || !sbs[0].EndAt.Equal(now.Add(time.Hour).Truncate(time.Millisecond)) || sbs[1].PauseDisk || sbs[1].AutoResume || sbs[1].PrivateTraffic {
			t.Fatalf("sandboxes: %+v", sbs)
		}
		s.DeleteSandbox(ctx, "vm-b")
		if _, err := s.GetSandbox(ctx, "vm-b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted sandbox: %v", err)
		}

		s.PutPort(ctx, &Port{VMID: "vm-a", Port: 8080, Kind: "tcp", HostAddr: "127.0.0.1", HostPort: 40000, CreatedAt: now})
		s.PutPort(ctx, &Port{VMID: "vm-a", Port: 8080, Kind: "tcp", HostAddr: "127.0.0.1", HostPort: 40001, Public: true, CreatedAt: now})
		s.PutPort(ctx, &Port{VMID: "vm-b", Port: 80, Kind: "http", CreatedAt: now})
		ps, err := s.ListPorts(ctx, "")
		if err != nil || len(ps) != 2 || ps[0].HostPort != 40001 || !ps[0].Public || ps[1].VMID != "vm-b" {
			t.Fatalf("every port after a replace: %+v %v", ps, err)
		}
		if err := s.DeletePort(ctx, "vm-b", 80, "http"); err != nil {
			t.Fatal(err)
		}
		s.PutDomain(ctx, &Domain{Domain: "b.test", VMID: "vm-a", Port: 80, CreatedAt: now})
		s.PutDomain(ctx, &Domain{Domain: "a.test", VMID: "vm-a", Port: 80, CreatedAt: now})
		if ds, _ := s.ListDomains(ctx, "vm-a"); len(ds) != 2 || ds[0].Domain != "a.test" {
			t.Fatalf("domains: %+v", ds)
		}
		if err := s.DeleteDomain(ctx, "a.test"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteDomain(ctx, "a.test"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete a deleted domain: %v", err)
		}
		if ds, _ := s.ListDomains(ctx, ""); len(ds) != 1 {
			t.Fatalf("every domain: %+v", ds)
		}

		n := &Network{Name: "n1", CreatedAt: now}
		s.CreateNetwork(ctx, n)
		s.CreateNetwork(ctx, &Network{Name: "n0", CreatedAt: now.Add(time.Second)})
		if err := s.UpdateNetwork(ctx, &Network{Name: "nx"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update a missing network: %v", err)
		}
		if ns, _ := s.ListNetworks(ctx); len(ns) != 2 || ns[0].Name != "n1" {
			t.Fatalf("networks: %+v", ns)
		}
		if err := s.DeleteNetwork(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteNetwork(ctx, "n1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete a deleted network: %v", err)
		}

		if seq, err := s.LastEventSeq(ctx); err != nil || seq != 0 {
			t.Fatalf("last seq of no events: %d %v", seq, err)
		}
		for _, vm := range []string{"vm-a", "vm-b", "vm-a"} {
			if err := s.AddEvent(ctx, &Event{VMID: vm, Time: now, Type: "lifecycle", Data: map[string]string{"k": vm}}); err != nil {
				t.Fatal(err)
			}
		}
		last, _ := s.LastEventSeq(ctx)
		if es, _ := s.ListEvents(ctx, "", 0, 10); len(es) != 3 || es[2].Seq != last || es[1].Data["k"] != "vm-b" {
			t.Fatalf("every event: %+v (last %d)", es, last)
		}
		s.DeleteEvents(ctx, "vm-a")
		if es, _ := s.ListEvents(ctx, "", 0, 10); len(es) != 1 || es[0].VMID != "vm-b" {
			t.Fatalf("events after deleting vm-a's: %+v", es)
		}
	})
}

// Creates racing for one name, or one idempotency key: exactly one wins,
// every other gets ErrConflict.
func TestConcurrentCreateConflict(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		const n = 16
		for _, c := range []struct {
			what string
			vm   func(i int) *VM
		}{
			{"name", func(i int) *VM { return &VM{ID: fmt.Sprintf("n-%d", i), Name: "same", NetIndex: 100 + i} }},
			{"idempotency key", func(i int) *VM {
				return &VM{ID: fmt.Sprintf("k-%d", i), Name: fmt.Sprintf("k-%d", i), IdempotencyKey: "key", NetIndex: 200 + i}
			}},
		} {
			var wg sync.WaitGroup
			errs := make([]error, n)
			start := make(chan struct{})
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v := c.vm(i)
					v.State, v.CreatedAt = "creating", time.Now()
					<-start
					errs[i] = s.CreateVM(ctx, v)
				}()
			}
			close(start)
			wg.Wait()
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case !errors.Is(err, ErrConflict):
					t.Errorf("%s: want nil or ErrConflict, got %v", c.what, err)
				}
			}
			if won != 1 {
				t.Errorf("%s: %d creates succeeded, want 1", c.what, won)
			}
		}
		vms, err := s.ListVMs(ctx)
		if err != nil || len(vms) != 2 {
			t.Fatalf("VMs after the races: %d %v", len(vms), err)
		}
	})
}
