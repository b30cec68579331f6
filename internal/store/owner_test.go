package store

import (
	"context"
	"errors"
	"testing"
)

func TestClaimOwner(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if err := s.ClaimOwner(ctx, ""); err == nil {
			t.Fatal("empty owner accepted")
		}
		for i := 0; i < 2; i++ { // a restart of the same daemon
			if err := s.ClaimOwner(ctx, "dir-a"); err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		if err := s.ClaimOwner(ctx, "dir-b"); !errors.Is(err, ErrOwned) {
			t.Fatalf("a second daemon's claim: %v", err)
		}
	})
}
