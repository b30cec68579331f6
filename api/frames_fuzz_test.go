package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

// frameHeader is a frame header claiming n payload bytes.
func frameHeader(typ byte, n uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{typ}, n)
}

// FuzzReadFrame decodes arbitrary streams with ReadFrame and ReadFrameReuse:
// no panic; both agree; io.EOF only at a frame boundary, io.ErrUnexpectedEOF
// for a truncated frame, ErrFrameTooLarge past MaxFramePayload; the frames
// read re-encode (AppendFrame) to exactly the bytes consumed; and ReadFrame
// allocates in proportion to the bytes that arrived, not to the length a
// header claims. Each input is also encoded as one frame and read back.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{})
	f.Add(AppendFrame(nil, FrameStdout, []byte("hello")))
	f.Add(AppendFrame(AppendFrame(nil, FrameStdinEOF, nil), FrameExit, []byte(`{"exit_code":3}`)))
	f.Add(AppendFrame(nil, FrameSignal, []byte("15"))[:6])                                         // truncated payload
	f.Add([]byte{FrameStdout, 0, 0})                                                               // truncated header
	f.Add(frameHeader(FrameStdout, MaxFramePayload))                                               // claims 16 MiB, sends none
	f.Add(frameHeader(FrameStderr, MaxFramePayload+1))                                             // oversized
	f.Add(frameHeader(0xff, 0xffffffff))                                                           // oversized, unknown type
	f.Add(append(frameHeader(FrameStdout, frameAllocStep+10), make([]byte, frameAllocStep+10)...)) // past one allocation step
	f.Add(append(frameHeader(FrameStdout, 4*frameAllocStep), make([]byte, frameAllocStep+10)...))  // truncated past one step
	f.Fuzz(func(t *testing.T, data []byte) {
		var frames []Frame
		r := bytes.NewReader(data)
		var rerr error
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				rerr = err
				break
			}
			frames = append(frames, fr)
		}

		var enc []byte
		for _, fr := range frames {
			if len(fr.Data) > MaxFramePayload {
				t.Fatalf("frame of %d bytes", len(fr.Data))
			}
			enc = AppendFrame(enc, fr.Type, fr.Data)
		}
		consumed := len(data) - r.Len()
		if !bytes.Equal(enc, data[:len(enc)]) {
			t.Fatal("decoded frames do not re-encode to the input")
		}
		rest := data[len(enc):]
		switch {
		case len(rest) == 0:
			if rerr != io.EOF {
				t.Fatalf("at a frame boundary: %v, want io.EOF", rerr)
			}
		case len(rest) < FrameHeaderLen:
			if rerr != io.ErrUnexpectedEOF {
				t.Fatalf("truncated header: %v, want io.ErrUnexpectedEOF", rerr)
			}
		case binary.BigEndian.Uint32(rest[1:5]) > MaxFramePayload:
			if !errors.Is(rerr, ErrFrameTooLarge) || consumed != len(enc)+FrameHeaderLen {
				t.Fatalf("oversized frame: %v after %d bytes", rerr, consumed)
			}
		default:
			if rerr != io.ErrUnexpectedEOF {
				t.Fatalf("truncated payload: %v, want io.ErrUnexpectedEOF", rerr)
			}
		}

		// A truncated frame that claims a large payload: the case where
		// allocating the claim would let a peer pin memory for nothing.
		if len(rest) >= FrameHeaderLen {
			if n := binary.BigEndian.Uint32(rest[1:5]); n > 64<<10 && n <= MaxFramePayload {
				checkAllocation(t, data)
			}
		}

		// ReadFrameReuse reads the same frames and stops with the same error.
		// It allocates what a header claims (it reads the trusted host's
		// frames in the guest), so skip inputs that would make it allocate
		// megabytes for nothing.
		if len(rest) < FrameHeaderLen || binary.BigEndian.Uint32(rest[1:5]) <= 1<<20 {
			compareReuse(t, data, frames, rerr)
		}

		// Encoder to decoder: the input as one frame's payload.
		if len(data) > 0 {
			var w bytes.Buffer
			if err := WriteFrame(&w, data[0], data[1:]); err != nil {
				t.Fatal(err)
			}
			if w.Len() != FrameHeaderLen+len(data)-1 {
				t.Fatalf("encoded %d payload bytes as %d", len(data)-1, w.Len())
			}
			fr, err := ReadFrame(&w)
			if err != nil || fr.Type != data[0] || !bytes.Equal(fr.Data, data[1:]) {
				t.Fatalf("round trip: %v", err)
			}
			if _, err := ReadFrame(&w); err != io.EOF {
				t.Fatalf("after the only frame: %v, want io.EOF", err)
			}
		}
	})
}

// compareReuse reads data with ReadFrameReuse: the same frames as ReadFrame,
// then the same error.
func compareReuse(t *testing.T, data []byte, frames []Frame, rerr error) {
	t.Helper()
	var buf []byte
	r := bytes.NewReader(data)
	for i := 0; ; i++ {
		fr, err := ReadFrameReuse(r, &buf)
		if err != nil {
			if err != rerr || i != len(frames) {
				t.Fatalf("ReadFrameReuse: %v after %d frames; ReadFrame: %v after %d", err, i, rerr, len(frames))
			}
			break
		}
		if i >= len(frames) || fr.Type != frames[i].Type || !bytes.Equal(fr.Data, frames[i].Data) {
			t.Fatalf("ReadFrameReuse frame %d differs", i)
		}
		if cap(buf) > MaxFramePayload {
			t.Fatalf("reuse buffer grew to %d bytes", cap(buf))
		}
	}
}

// checkAllocation checks that reading data with ReadFrame allocates in
// proportion to its length: what the frames hold, plus what readPayload
// grows ahead of the bytes that arrived (one step, then doubling), plus
// slack for the runtime. ReadMemStats stops the world, so only inputs
// where it matters are measured.
func checkAllocation(t *testing.T, data []byte) {
	t.Helper()
	r := bytes.NewReader(data)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for {
		if _, err := ReadFrame(r); err != nil {
			break
		}
	}
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(2*frameAllocStep+4*len(data)+64<<10); got > limit {
		t.Fatalf("reading %d bytes allocated %d bytes (limit %d)", len(data), got, limit)
	}
}
