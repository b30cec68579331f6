package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestVMCRUD(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		idx, _ := s.FreeNetIndex(ctx)
		a := &VM{ID: "vm-a", Name: "a", State: "running", NetIndex: idx, IdempotencyKey: "k1", CreatedAt: time.Now(), Labels: map[string]string{"x": "y"}}
		if err := s.CreateVM(ctx, a); err != nil {
			t.Fatal(err)
		}
		for _, dup := range []*VM{
			{ID: "vm-b", Name: "a", NetIndex: 9, CreatedAt: time.Now()},
			{ID: "vm-c", Name: "c", NetIndex: 10, IdempotencyKey: "k1", CreatedAt: time.Now()},
			{ID: "vm-d", Name: "d", NetIndex: idx, CreatedAt: time.Now()},
		} {
			if err := s.CreateVM(ctx, dup); !errors.Is(err, ErrConflict) {
				t.Errorf("create %s: want ErrConflict, got %v", dup.ID, err)
			}
		}
		if i, _ := s.FreeNetIndex(ctx); i != idx+1 {
			t.Errorf("free index %d, want %d", i, idx+1)
		}
		got, err := s.GetVM(ctx, "a")
		if err != nil || got.ID != "vm-a" || got.Labels["x"] != "y" {
			t.Fatalf("get by name: %+v %v", got, err)
		}
		if got, err := s.GetVMByIdempotencyKey(ctx, "k1"); err != nil || got.ID != "vm-a" {
			t.Fatalf("get by key: %+v %v", got, err)
		}
		got.State = "stopped"
		if err := s.UpdateVM(ctx, got); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.GetVM(ctx, "vm-a"); v.State != "stopped" {
			t.Errorf("state %q", v.State)
		}
		if err := s.DeleteVM(ctx, "vm-a"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetVM(ctx, "vm-a"); !errors.Is(err, ErrNotFound) {
			t.Errorf("after delete: %v", err)
		}
		if err := s.UpdateVM(ctx, got); !errors.Is(err, ErrNotFound) {
			t.Errorf("update missing: %v", err)
		}
	})
}
