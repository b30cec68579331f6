package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrimLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "vm.log")
	// A writer that keeps its O_APPEND descriptor across the trim, as QEMU does.
	w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const max = 1000
	w.Write(bytes.Repeat([]byte("a"), 900))
	if n, err := trimLog(p, max); n != 0 || err != nil {
		t.Fatalf("under the bound: dropped %d, %v", n, err)
	}
	w.Write(bytes.Repeat([]byte("b"), 600)) // 1500 bytes
	n, err := trimLog(p, max)
	if n != 1000 || err != nil {
		t.Fatalf("dropped %d, %v", n, err)
	}
	w.Write([]byte("after\n"))
	b, _ := os.ReadFile(p)
	head, rest, _ := strings.Cut(string(b), "\n")
	if !strings.HasPrefix(head, "[agentvm ") || !strings.Contains(head, "1000 older bytes dropped") ||
		rest != strings.Repeat("b", 500)+"after\n" {
		t.Fatalf("log after trim: %q", b)
	}
	if len(b) > max {
		t.Fatalf("log is %d bytes", len(b))
	}
	if n, err := trimLog(filepath.Join(t.TempDir(), "none"), max); n != 0 || err != nil {
		t.Fatalf("missing log: %d %v", n, err)
	}
}
