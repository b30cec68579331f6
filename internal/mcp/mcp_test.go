package mcp

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentvm/agentvm/api"
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

// run_code keeps what it shows: output past the bound is counted, not kept.
func TestBoundedRun(t *testing.T) {
	r := newBoundedRun()
	chunk := strings.Repeat("x", 1000)
	for i := 0; i < 1000; i++ {
		r.add(api.CodeEvent{Type: api.CodeStdout, Text: chunk})
	}
	if r.stdout.b.Len() != maxShown || r.stdout.total != 1000*1000 {
		t.Fatalf("kept %d of %d bytes", r.stdout.b.Len(), r.stdout.total)
	}
	big := json.RawMessage(`"` + strings.Repeat("A", maxResultBytes+1) + `"`)
	for i := 0; i < 20; i++ {
		r.add(api.CodeEvent{Type: api.CodeResult, Data: map[string]json.RawMessage{"text/plain": json.RawMessage(`"1"`)}})
	}
	r.add(api.CodeEvent{Type: api.CodeResult, Data: map[string]json.RawMessage{"image/png": big}})
	if len(r.results) != maxResults || r.dropped != 20+1-maxResults {
		t.Fatalf("results kept %d, dropped %d", len(r.results), r.dropped)
	}
}
