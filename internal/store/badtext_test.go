package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A NUL byte or invalid UTF-8 in a looked-up name (from a URL path, say) finds nothing on
// either backend, rather than an error that would read as a server fault
// (PostgreSQL's text cannot hold them); a write of one is refused on both.
func TestBadText(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		for _, bad := range []string{"a\x00b", "caf\xe9"} {
			testBadText(t, s, bad)
		}
	})
}

func testBadText(t *testing.T, s *Store, bad string) {
	ctx := context.Background()
	if _, err := s.GetVM(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetVM: %v", err)
	}
	if _, err := s.GetVMByIdempotencyKey(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetVMByIdempotencyKey: %v", err)
	}
	if _, err := s.GetSnapshot(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSnapshot: %v", err)
	}
	if _, err := s.GetNetwork(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetNetwork: %v", err)
	}
	if _, err := s.GetDomain(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetDomain: %v", err)
	}
	if _, err := s.GetSandbox(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSandbox: %v", err)
	}
	if _, err := s.TokenByHash(ctx, bad, time.Now()); !errors.Is(err, ErrNotFound) {
		t.Errorf("TokenByHash: %v", err)
	}
	if es, err := s.ListEvents(ctx, bad, 0, 10); err != nil || len(es) != 0 {
		t.Errorf("ListEvents: %v %v", es, err)
	}
	if err := s.DeleteNetwork(ctx, bad); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteNetwork: %v", err)
	}
	if err := s.DeleteVM(ctx, bad); err != nil {
		t.Errorf("DeleteVM: %v", err)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm1", Name: "n", IdempotencyKey: bad, NetIndex: 1, CreatedAt: time.Now()}); !errors.Is(err, ErrBadText) {
		t.Fatalf("create with %q: %v", bad, err)
	}
	if err := s.CreateNetwork(ctx, &Network{Name: bad}); !errors.Is(err, ErrBadText) {
		t.Fatalf("network %q: %v", bad, err)
	}
	if err := s.AddEvent(ctx, &Event{VMID: bad}); !errors.Is(err, ErrBadText) {
		t.Fatalf("event of %q: %v", bad, err)
	}
	if vms, _ := s.ListVMs(ctx); len(vms) != 0 {
		t.Fatalf("VMs after a refused create: %d", len(vms))
	}
}
