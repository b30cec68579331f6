package builder

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

func TestSplitRef(t *testing.T) {
	for ref, want := range map[string][2]string{
		"app": {"app", ""}, "app:v1": {"app", "v1"}, "app:latest": {"app", ""}, "app:default": {"app", ""},
		"my.app:V_1.2-rc": {"my.app", "V_1.2-rc"},
	} {
		n, tag, err := SplitRef(ref)
		if err != nil || n != want[0] || tag != want[1] {
			t.Errorf("SplitRef(%q) = %q %q %v, want %q %q", ref, n, tag, err, want[0], want[1])
		}
	}
	for _, bad := range []string{"", "App", "app:", "app:-x", "app:.x", "app:a/b", "host:5000/app", ":v1", "app:v1:v2"} {
		if _, _, err := SplitRef(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SplitRef(%q): %v, want ErrInvalid", bad, err)
		}
	}
	if Ref("app", "v1") != "app:v1" || Ref("app", "latest") != "app" || Ref("app", "") != "app" {
		t.Fatal("Ref")
	}
}

// TestTags: a tag is a record of its own; it stays on its build, moves when
// given again, and goes alone.
func TestTags(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := New(nil, st, t.TempDir(), "", slog.New(slog.DiscardHandler))
	put := func(name, snap string) {
		if err := st.PutTemplate(ctx, &store.Template{Name: name, SnapshotID: snap, Base: "default", CreatedAt: time.Now(), BuiltAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	snapOf := func(ref string) string {
		x, err := b.Get(ctx, ref)
		if err != nil {
			return "missing"
		}
		return x.SnapshotID
	}
	put("app", "s1")
	if _, err := b.Tag(ctx, "app", []string{"v1", "stable"}); err != nil {
		t.Fatal(err)
	}
	put("app", "s2") // a rebuild
	if snapOf("app") != "s2" || snapOf("app:v1") != "s1" || snapOf("app:stable") != "s1" || snapOf("app:latest") != "s2" {
		t.Fatalf("after a rebuild: app %s v1 %s stable %s", snapOf("app"), snapOf("app:v1"), snapOf("app:stable"))
	}
	if _, err := b.Tag(ctx, "app", []string{"stable"}); err != nil { // moves
		t.Fatal(err)
	}
	if snapOf("app:stable") != "s2" {
		t.Fatal("a tag given again did not move")
	}
	if _, err := b.Tag(ctx, "app:v1", []string{"latest"}); err != nil {
		t.Fatal(err)
	}
	if snapOf("app") != "s1" {
		t.Fatal("tag latest did not move the name")
	}
	ts, err := b.Tags(ctx, "app")
	if err != nil || len(ts) != 3 {
		t.Fatalf("Tags: %d %v", len(ts), err)
	}
	for _, bad := range []struct {
		src  string
		tags []string
		want error
	}{{"app", nil, ErrInvalid}, {"app", []string{"a b"}, ErrInvalid}, {"app:nope", []string{"x"}, ErrNotFound}, {"nope", []string{"x"}, ErrNotFound}} {
		if _, err := b.Tag(ctx, bad.src, bad.tags); !errors.Is(err, bad.want) {
			t.Errorf("Tag(%q, %q): %v, want %v", bad.src, bad.tags, err, bad.want)
		}
	}
	if err := b.Delete(ctx, "app:v1"); err != nil {
		t.Fatal(err)
	}
	if snapOf("app:v1") != "missing" || snapOf("app") != "s1" || snapOf("app:stable") != "s2" {
		t.Fatal("removing a tag touched another record")
	}
	put("child", "s3")
	c, _ := st.GetTemplate(ctx, "child")
	c.Base = "app:stable"
	st.PutTemplate(ctx, c)
	if err := b.Delete(ctx, "app:stable"); !errors.Is(err, ErrConflict) {
		t.Fatalf("removing a tag a template is built on: %v", err)
	}
}
