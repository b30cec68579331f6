package api

import (
	"bytes"
	"io"
	"runtime"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	frames := []Frame{{FrameStdout, []byte("hello")}, {FrameStdinEOF, nil}, {FrameExit, []byte(`{"exit_code":3}`)}, {FrameStderr, bytes.Repeat([]byte{0}, 70000)}}
	for _, f := range frames {
		if err := WriteFrame(&buf, f.Type, f.Data); err != nil {
			t.Fatal(err)
		}
	}
	if got := buf.Bytes()[:5]; !bytes.Equal(got, []byte{3, 0, 0, 0, 5}) {
		t.Fatalf("header = %v", got)
	}
	for _, want := range frames {
		got, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != want.Type || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("got %d/%d bytes, want %d/%d", got.Type, len(got.Data), want.Type, len(want.Data))
		}
	}
	if _, err := ReadFrame(&buf); err != io.EOF {
		t.Fatalf("at end: %v, want EOF", err)
	}
	// Truncated payload.
	b := AppendFrame(nil, FrameStdout, []byte("abcdef"))
	if _, err := ReadFrame(bytes.NewReader(b[:8])); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated: %v", err)
	}
	// Oversized.
	if _, err := ReadFrame(bytes.NewReader([]byte{3, 0xff, 0, 0, 0})); err != ErrFrameTooLarge {
		t.Fatalf("oversized: %v", err)
	}
}

// TestReadFrameAllocatesAsDataArrives: a length field alone does not make
// ReadFrame allocate it; frames larger than one allocation step still
// arrive intact.
func TestReadFrameAllocatesAsDataArrives(t *testing.T) {
	claim := make([]byte, FrameHeaderLen)
	PutFrameHeader(claim, FrameStdout, MaxFramePayload)
	claim = append(claim, "only ten b"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadFrame(bytes.NewReader(claim))
	runtime.ReadMemStats(&after)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("err = %v, want unexpected EOF", err)
	}
	// Without the step it is the full claim, 16 MiB; the slack is for
	// the race detector and other goroutines.
	if n := after.TotalAlloc - before.TotalAlloc; n > MaxFramePayload/4 {
		t.Fatalf("ReadFrame allocated %d bytes for a frame that sent 10", n)
	}

	payload := make([]byte, 3*frameAllocStep+7)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	f, err := ReadFrame(bytes.NewReader(AppendFrame(nil, FrameStderr, payload)))
	if err != nil || f.Type != FrameStderr || !bytes.Equal(f.Data, payload) {
		t.Fatalf("large frame: %v, type %d, %d bytes", err, f.Type, len(f.Data))
	}
}
