package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func FuzzWriteJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "\x00\x01\x1f\b\f\n\r\t\"\\", "<a href='x'>&</a>", "日本語 🙂", "\xff\xfe bad \xc3", "\u2028\u2029", strings.Repeat("\x00", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		writeJSONString(w, s)
		w.Flush()
		want, _ := json.Marshal(s)
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("%q: wrote %s, encoding/json %s", s, b.Bytes(), want)
		}
	})
}
