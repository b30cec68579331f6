package api

import (
	"encoding/json"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{
		"512": 512 << 20, "512M": 512 << 20, "512MiB": 512 << 20, "1G": 1 << 30, "1.5G": 3 << 29,
		"2048K": 2 << 20, "8gb": 8 << 30, " 1T ": 1 << 40,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "abc", "-1G", "0", "12X", "512B", "1e400", "NaN", "G"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestSizeJSON(t *testing.T) {
	var v struct{ M Size }
	if err := json.Unmarshal([]byte(`{"M":1024}`), &v); err != nil || v.M != 1<<30 {
		t.Fatalf("number: %d %v", v.M, err)
	}
	if err := json.Unmarshal([]byte(`{"M":"2G"}`), &v); err != nil || v.M != 2<<30 {
		t.Fatalf("string: %d %v", v.M, err)
	}
	for _, bad := range []string{`{"M":-1}`, `{"M":"x"}`, `{"M":true}`} {
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if Size(512<<10).MiB() != 1 || Size(3<<30).MiB() != 3072 {
		t.Error("MiB rounding")
	}
}
