package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// The cost of the store's hot calls on each backend (PostgreSQL on a unix
// socket): go test -run - -bench . ./internal/store/
func BenchmarkStore(b *testing.B) {
	for _, be := range []struct {
		name string
		dsn  func(b *testing.B) string
	}{
		{"sqlite", func(b *testing.B) string { return filepath.Join(b.TempDir(), "agentvm.db") }},
		{"postgres", func(b *testing.B) string { return pgtest.Database(b) }},
	} {
		b.Run(be.name, func(b *testing.B) {
			s, err := Open(be.dsn(b))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			n := 0 // across the benchmark's rounds: every VM is new
			b.Run("CreateVM", func(b *testing.B) {
				for range b.N {
					n++
					id := fmt.Sprintf("vm-%d", n)
					if err := s.CreateVM(ctx, &VM{ID: id, Name: id, NetIndex: 1000 + n, CreatedAt: time.Now()}); err != nil {
						b.Fatal(err)
					}
				}
			})
			s.CreateVM(ctx, &VM{ID: "vm-x", Name: "x", NetIndex: 1, CreatedAt: time.Now()})
			b.Run("GetVM", func(b *testing.B) {
				for range b.N {
					if _, err := s.GetVM(ctx, "x"); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("AddEvent", func(b *testing.B) {
				for range b.N {
					if err := s.AddEvent(ctx, &Event{VMID: "vm-x", Time: time.Now(), Type: "exec"}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
