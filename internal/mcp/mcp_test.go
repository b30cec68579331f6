package mcp

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTextCuts(t *testing.T) {
	s := strings.Repeat("é", 10) // 2 bytes each
	for max := 0; max <= len(s); max++ {
		got, cut := truncate(s, max)
		if !utf8.ValidString(got) || len(got) > max || cut != (max < len(s)) {
			t.Fatalf("truncate(%d) = %q %v", max, got, cut)
		}
		if tl := tail(s, max); !utf8.ValidString(tl) || len(tl) > max {
			t.Fatalf("tail(%d) = %q", max, tl)
		}
	}
	b := []byte("ab€") // € is 3 bytes
	for i := 2; i < len(b); i++ {
		if got := trimRunes(b[:i]); string(got) != "ab" {
			t.Fatalf("trimRunes(%q) = %q", b[:i], got)
		}
	}
	if got := trimRunes(b); string(got) != "ab€" {
		t.Fatalf("a whole character was trimmed: %q", got)
	}
}
