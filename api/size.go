package api

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Size is a byte count that unmarshals from a JSON number (MiB) or a string with an
// optional K/M/G/T suffix (binary units; a bare number means MiB).
type Size int64

// ParseSize parses "512", "512M", "1G", "1.5G", "2048K". A bare number is MiB.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	for _, unit := range []string{"KIB", "MIB", "GIB", "TIB", "KB", "MB", "GB", "TB"} {
		if strings.HasSuffix(t, unit) {
			t = t[:len(t)-len(unit)+1] // keep the K/M/G/T letter
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("invalid size %q: empty", s)
	}
	mult := float64(1 << 20)
	switch t[len(t)-1] {
	case 'K':
		mult, t = 1<<10, t[:len(t)-1]
	case 'M':
		mult, t = 1<<20, t[:len(t)-1]
	case 'G':
		mult, t = 1<<30, t[:len(t)-1]
	case 'T':
		mult, t = 1<<40, t[:len(t)-1]
	}
	f, err := strconv.ParseFloat(t, 64)
	// f*mult < 1 would truncate to 0 bytes, which reads as "unset".
	if err != nil || f*mult < 1 || f != f || f*mult > 1<<50 {
		return 0, fmt.Errorf("invalid size %q: want a positive number of MiB or a value with a K/M/G/T suffix, like 512M or 8G", s)
	}
	return Size(f * mult), nil
}

// MiB returns the size in MiB, rounded up (so a tiny size is not mistaken for "unset").
func (s Size) MiB() int64 { return (int64(s) + 1<<20 - 1) >> 20 }

func (s Size) String() string {
	switch {
	case s%(1<<30) == 0:
		return fmt.Sprintf("%dG", s>>30)
	case s%(1<<20) == 0:
		return fmt.Sprintf("%dM", s>>20)
	}
	// Not whole KiB: a fraction, exact in float64 (a power-of-two divisor
	// and at most 2^50), so that ParseSize(s.String()) == s.
	return strconv.FormatFloat(float64(s)/(1<<10), 'f', -1, 64) + "K"
}

func (s *Size) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		v, err := ParseSize(str)
		if err != nil {
			return err
		}
		*s = v
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("invalid size %s: want MiB or a string like \"1G\"", b)
	}
	if n*(1<<20) < 1 || n > 1<<30 {
		return fmt.Errorf("invalid size %s: want a positive number of MiB", b)
	}
	*s = Size(n * (1 << 20))
	return nil
}

func (s Size) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// Duration unmarshals from a Go duration string ("30s") or a number of seconds.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		v, err := time.ParseDuration(str)
		if err != nil || v < 0 {
			return fmt.Errorf("invalid duration %q: want a value like 30s or 5m", str)
		}
		*d = Duration(v)
		return nil
	}
	var n float64
	// Beyond MaxInt64 nanoseconds the conversion below would wrap negative.
	if err := json.Unmarshal(b, &n); err != nil || n < 0 || n*float64(time.Second) >= 1<<63 {
		return fmt.Errorf("invalid duration %s: want seconds or a string like \"30s\"", b)
	}
	*d = Duration(n * float64(time.Second))
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
