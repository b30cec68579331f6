package server

import (
	"bufio"
	"unicode/utf8"
)

// writeJSONString writes s as a JSON string, escaped as encoding/json
// escapes it (HTML characters too), straight into w: a buffered exec's
// output of 16 MiB of NUL bytes would otherwise be held a second time, six
// times over, as its escaped copy.
func writeJSONString(w *bufio.Writer, s string) {
	const hex = "0123456789abcdef"
	w.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			w.WriteString(s[start:i])
			switch b {
			case '"', '\\':
				w.WriteByte('\\')
				w.WriteByte(b)
			case '\b':
				w.WriteString(`\b`)
			case '\f':
				w.WriteString(`\f`)
			case '\n':
				w.WriteString(`\n`)
			case '\r':
				w.WriteString(`\r`)
			case '\t':
				w.WriteString(`\t`)
			default:
				w.WriteString(`\u00`)
				w.WriteByte(hex[b>>4])
				w.WriteByte(hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			w.WriteString(s[start:i])
			w.WriteString(`\ufffd`)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			w.WriteString(s[start:i])
			w.WriteString(`\u202`)
			w.WriteByte(hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	w.WriteString(s[start:])
	w.WriteByte('"')
}
