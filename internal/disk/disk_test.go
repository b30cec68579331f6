package disk

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func needQemuImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img")
	}
}

func virtualSize(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "virtual size:") {
			return l
		}
	}
	t.Fatalf("no virtual size in %s", out)
	return ""
}

// A chain: overlays name their backing, keep or set its size, and resize.
func TestChain(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	base, mid, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "mid.qcow2"), filepath.Join(dir, "top.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if b, err := Backing(ctx, base); err != nil || b != "" {
		t.Fatalf("a base's backing: %q %v", b, err)
	}
	if err := Overlay(ctx, base, mid, 0); err != nil {
		t.Fatal(err)
	}
	if err := Overlay(ctx, mid, top, 128<<20); err != nil {
		t.Fatal(err)
	}
	if b, err := Backing(ctx, top); err != nil || b != mid {
		t.Fatalf("top's backing: %q %v", b, err)
	}
	if got := virtualSize(t, mid); !strings.Contains(got, "64 MiB") {
		t.Fatalf("mid keeps its backing's size: %s", got)
	}
	if got := virtualSize(t, top); !strings.Contains(got, "128 MiB") {
		t.Fatalf("top has the size asked for: %s", got)
	}
	if err := Resize(ctx, top, 256<<20); err != nil {
		t.Fatal(err)
	}
	if got := virtualSize(t, top); !strings.Contains(got, "256 MiB") {
		t.Fatalf("resized: %s", got)
	}
	// Errors name the operation and qemu-img's reason.
	if err := Overlay(ctx, filepath.Join(dir, "missing.qcow2"), filepath.Join(dir, "x.qcow2"), 0); err == nil || !strings.Contains(err.Error(), "create overlay") {
		t.Fatalf("overlay on a missing backing: %v", err)
	}
	if _, err := Backing(ctx, filepath.Join(dir, "missing.qcow2")); err == nil {
		t.Fatal("backing of a missing file: no error")
	}
}

// Collect deletes only old layers nothing uses.
func TestCollect(t *testing.T) {
	l := Layers{Dir: t.TempDir()}
	old := time.Now().Add(-time.Hour)
	paths := map[string]string{}
	for _, name := range []string{"used", "unused", "young"} {
		p := l.NewPath("vm-" + name)
		if filepath.Dir(p) != l.Dir || !strings.HasPrefix(filepath.Base(p), "vm-"+name+"-") {
			t.Fatalf("new path %s", p)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if name != "young" {
			os.Chtimes(p, old, old)
		}
		paths[name] = p
	}
	removed := l.Collect(func(p string) bool { return p == paths["used"] }, time.Minute)
	if !slices.Equal(removed, []string{paths["unused"]}) {
		t.Fatalf("removed %v", removed)
	}
	for _, name := range []string{"used", "young"} {
		if _, err := os.Stat(paths[name]); err != nil {
			t.Fatalf("%s layer: %v", name, err)
		}
	}
	if a, b := l.NewPath("x"), l.NewPath("x"); a == b {
		t.Fatal("two new paths are the same")
	}
}
