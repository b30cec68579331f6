package api

import (
	"encoding/json"
	"testing"
)

// maxSize is the largest size ParseSize and Size.UnmarshalJSON accept (1 PiB).
const maxSize = 1 << 50

// FuzzParseSize checks that a size, from the CLI (ParseSize) or from JSON
// (Size.UnmarshalJSON), is either rejected or a positive byte count of at
// most 1 PiB, and that an accepted size survives String and JSON unchanged:
// the CLI sends a Size to the server as its String.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{
		"512", "512M", "512MiB", "1G", "1.5G", "2048K", "8gb", " 1T ", "1024", "0.5", "3K", "1.3K",
		"", "abc", "-1G", "0", "12X", "512B", "1e400", "NaN", "G", "Inf", "+Inf", "-0", "0x1p10",
		"0.0000001K", "1_000", "1048576T", "1024T", "1e15", "4.4e-16T", `"1G"`, `1`, `0.0001`, `1073741825`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err == nil {
			checkSize(t, "ParseSize("+s+")", v)
		}
		// The same text as a JSON value: a number of MiB or a string.
		var j Size
		if err := json.Unmarshal([]byte(s), &j); err == nil {
			checkSize(t, "json "+s, j)
		}
	})
}

func checkSize(t *testing.T, what string, v Size) {
	t.Helper()
	if v <= 0 || v > maxSize {
		t.Fatalf("%s accepted as %d bytes: want 1..%d", what, int64(v), int64(maxSize))
	}
	if v.MiB() < 1 {
		t.Fatalf("%s = %d bytes is %d MiB: a set size must not read as unset", what, int64(v), v.MiB())
	}
	back, err := ParseSize(v.String())
	if err != nil || back != v {
		t.Fatalf("%s = %d bytes: String %q parses back as %d, %v", what, int64(v), v.String(), int64(back), err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: marshal: %v", what, err)
	}
	var j Size
	if err := json.Unmarshal(b, &j); err != nil || j != v {
		t.Fatalf("%s = %d bytes: JSON %s reads back as %d, %v", what, int64(v), b, int64(j), err)
	}
}

// FuzzDuration checks that a JSON duration is rejected or non-negative: a
// negative one would be taken for "off" by the policies that use it.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{`"30s"`, `"5m"`, `"1h30m"`, `30`, `0.5`, `0`, `"-1s"`, `-1`, `"x"`, `true`, `null`,
		`"2562047h47m16.854775807s"`, `9223372036`, `"9999999999h"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var d Duration
		if err := json.Unmarshal([]byte(s), &d); err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("%s accepted as a negative duration %d", s, int64(d))
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("%s: marshal: %v", s, err)
		}
		var back Duration
		if err := json.Unmarshal(b, &back); err != nil || back != d {
			t.Fatalf("%s = %d: JSON %s reads back as %d, %v", s, int64(d), b, int64(back), err)
		}
	})
}
