package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestTemplatesAndLayers(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		at := time.Date(2026, 12, 6, 1, 2, 3, 456789000, time.UTC)
		tpl := &Template{Name: "app", SnapshotID: "snap-1", Base: "default", Dockerfile: "FROM default\n", Layers: []string{"k0", "k1"},
			Steps: []string{"FROM default"}, Start: []string{"serve.sh"}, Ready: "curl -f localhost", Env: map[string]string{"PORT": "8000"},
			Workdir: "/opt/app", User: "user", Expose: []int{8000}, BuildLog: "[1/2] FROM default\n", BuildMs: 1234, CreatedAt: at, BuiltAt: at.Add(time.Second)}
		allSet(t, tpl)
		if err := s.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplate(ctx, "app")
		if err != nil || !reflect.DeepEqual(got, tpl) {
			t.Fatalf("read back %+v %v, want %+v", got, err, tpl)
		}
		// A rebuild replaces the record and keeps its creation time.
		re := *tpl
		re.SnapshotID, re.CreatedAt, re.BuiltAt = "snap-2", at.Add(time.Hour), at.Add(time.Hour)
		if err := s.PutTemplate(ctx, &re); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetTemplate(ctx, "app"); got.SnapshotID != "snap-2" || !got.CreatedAt.Equal(at) {
			t.Fatalf("after a rebuild: %+v", got)
		}
		if ts, err := s.ListTemplates(ctx); err != nil || len(ts) != 1 {
			t.Fatalf("list: %v %v", ts, err)
		}
		if err := s.DeleteTemplate(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTemplate(ctx, "app"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		l := &Layer{Key: "k1", SnapshotID: "snap-1", Parent: "k0", Step: "RUN true", CreatedAt: at}
		allSet(t, l)
		if err := s.PutLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := s.PutLayer(ctx, l); !errors.Is(err, ErrConflict) {
			t.Fatalf("a second layer of the same key: %v", err)
		}
		if got, err := s.GetLayer(ctx, "k1"); err != nil || !reflect.DeepEqual(got, l) {
			t.Fatalf("layer %+v %v", got, err)
		}
		if err := s.DeleteLayer(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetLayer(ctx, "k1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted layer: %v", err)
		}
	})
}
