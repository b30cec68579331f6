package api

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"slices"
)

// The frame codec of exec streams, shared by the public API (client <->
// daemon) and the guest channel (daemon <-> agent), which use the same
// frame types (FrameStdin ... FrameSignal): 1 byte type, 4 bytes
// big-endian length, payload.

// FrameHeaderLen is the size of a frame header.
const FrameHeaderLen = 5

// MaxFramePayload bounds frame payloads accepted by ReadFrame.
const MaxFramePayload = 16 << 20

// ErrFrameTooLarge is returned by ReadFrame for an oversized frame.
var ErrFrameTooLarge = errors.New("frame too large")

// Frame is one decoded exec frame.
type Frame struct {
	Type byte
	Data []byte
}

// PutFrameHeader writes a frame header into b[:5].
func PutFrameHeader(b []byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:5], uint32(n))
}

// AppendFrame appends an encoded frame to b.
func AppendFrame(b []byte, typ byte, payload []byte) []byte {
	var h [FrameHeaderLen]byte
	PutFrameHeader(h[:], typ, len(payload))
	b = append(b, h[:]...)
	return append(b, payload...)
}

// WriteFrame writes one frame with a single Write call.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	_, err := w.Write(AppendFrame(make([]byte, 0, FrameHeaderLen+len(payload)), typ, payload))
	return err
}

// WriteJSONFrame writes a frame whose payload is v encoded as JSON.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, typ, b)
}

// readHeader reads a frame header and checks the length it claims.
func readHeader(r io.Reader) (typ byte, n uint32, err error) {
	var h [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	n = binary.BigEndian.Uint32(h[1:5])
	if n > MaxFramePayload {
		return 0, 0, ErrFrameTooLarge
	}
	return h[0], n, nil
}

// ReadFrame reads one frame. It returns io.EOF only on a clean end of stream
// before a header, io.ErrUnexpectedEOF for a truncated frame.
func ReadFrame(r io.Reader) (Frame, error) {
	typ, n, err := readHeader(r)
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Type: typ}
	if n > 0 {
		if f.Data, err = readPayload(r, int(n)); err != nil {
			return Frame{}, err
		}
	}
	return f, nil
}

// frameAllocStep is the most ReadFrame allocates ahead of payload bytes
// actually arriving. A length field is only the peer's claim: allocating it
// up front would let a guest that announces 16 MiB frames and then stalls
// pin 16 MiB per stream in the daemon for 5 bytes sent. The agent's exec
// chunks (256 KiB) still take a single allocation.
const frameAllocStep = 256 << 10

// readPayload reads n bytes, growing the slice (doubling) as they arrive.
func readPayload(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, min(n, frameAllocStep))
	got := 0
	for {
		m, err := io.ReadFull(r, b[got:])
		got += m
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if got == n {
			return b, nil
		}
		b = slices.Grow(b, min(n-got, got))[:got+min(n-got, got)]
	}
}

// ReadFrameReuse is ReadFrame reading the payload into *buf (grown as
// needed) instead of a new slice: f.Data is valid until the next call.
func ReadFrameReuse(r io.Reader, buf *[]byte) (Frame, error) {
	typ, n, err := readHeader(r)
	if err != nil {
		return Frame{}, err
	}
	if uint32(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	f := Frame{Type: typ, Data: (*buf)[:n]}
	if _, err := io.ReadFull(r, f.Data); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}
