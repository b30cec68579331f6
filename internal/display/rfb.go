package display

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ViewOnly copies a VNC (RFB) client's stream from src to dst, the VNC
// server, leaving out everything that would act on the display: key and
// pointer events, clipboard text, desktop resizes and the QEMU and xvp
// extensions. It frames every client message of RFB 3.7 and 3.8 with no
// security or VNC authentication (what noVNC and x11vnc speak), and ends
// with an error at anything it cannot frame, so nothing it does not know
// passes. It returns nil when src ends between messages.
func ViewOnly(dst io.Writer, src io.Reader) error {
	br := bufio.NewReaderSize(src, 64<<10)
	f := &rfbFilter{r: br, w: dst}
	return f.run()
}

type rfbFilter struct {
	r *bufio.Reader
	w io.Writer
}

// pass copies n bytes through.
func (f *rfbFilter) pass(n int64) error {
	_, err := io.CopyN(f.w, f.r, n)
	return err
}

// drop reads n bytes and forgets them.
func (f *rfbFilter) drop(n int64) error {
	_, err := io.CopyN(io.Discard, f.r, n)
	return err
}

// peek returns the next n bytes (n <= 64) without consuming them.
func (f *rfbFilter) peek(n int) ([]byte, error) {
	return f.r.Peek(n)
}

func (f *rfbFilter) run() error {
	// The handshake: the client's version, its choice of security type
	// (3.7+), VNC authentication's response when it chose that, and
	// ClientInit's shared flag.
	v, err := f.peek(12)
	if err != nil {
		return eof(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(v), "RFB %03d.%03d\n", &major, &minor); err != nil || major != 3 || minor < 7 {
		return fmt.Errorf("view-only VNC speaks RFB 3.7 and 3.8, the client sent %q", v)
	}
	if err := f.pass(12); err != nil {
		return err
	}
	sec, err := f.peek(1)
	if err != nil {
		return eof(err)
	}
	switch sec[0] {
	case 1: // None
		err = f.pass(1)
	case 2: // VNC authentication: the 16-byte response follows
		err = f.pass(17)
	default:
		return fmt.Errorf("view-only VNC: security type %d is not supported", sec[0])
	}
	if err != nil {
		return err
	}
	if err := f.pass(1); err != nil { // ClientInit
		return eof(err)
	}
	for {
		t, err := f.peek(1)
		if err != nil {
			return eof(err)
		}
		if err := f.message(t[0]); err != nil {
			return err
		}
	}
}

// message copies or drops one client message of type t.
func (f *rfbFilter) message(t byte) error {
	switch t {
	case 0: // SetPixelFormat
		return f.pass(20)
	case 2: // SetEncodings: u16 count of s32 encodings
		h, err := f.peek(4)
		if err != nil {
			return err
		}
		return f.pass(4 + 4*int64(binary.BigEndian.Uint16(h[2:])))
	case 3: // FramebufferUpdateRequest
		return f.pass(10)
	case 150: // EnableContinuousUpdates
		return f.pass(10)
	case 248: // ClientFence: flags, u8 length, payload (at most 64)
		h, err := f.peek(9)
		if err != nil {
			return err
		}
		if h[8] > 64 {
			return errors.New("view-only VNC: a fence longer than 64 bytes")
		}
		return f.pass(9 + int64(h[8]))
	case 4: // KeyEvent
		return f.drop(8)
	case 5: // PointerEvent
		return f.drop(6)
	case 6: // ClientCutText: u32 length of text
		h, err := f.peek(8)
		if err != nil {
			return err
		}
		return f.drop(8 + int64(binary.BigEndian.Uint32(h[4:])))
	case 250: // xvp (shutdown, reboot, reset)
		return f.drop(4)
	case 251: // SetDesktopSize: u8 screen count, 16 bytes each
		h, err := f.peek(8)
		if err != nil {
			return err
		}
		return f.drop(8 + 16*int64(h[6]))
	case 255: // QEMU: extended key events (subtype 0) are input
		h, err := f.peek(2)
		if err != nil {
			return err
		}
		if h[1] == 0 {
			return f.drop(12)
		}
		return fmt.Errorf("view-only VNC: QEMU client message subtype %d is not supported", h[1])
	}
	return fmt.Errorf("view-only VNC: client message type %d is not supported", t)
}

// eof maps a clean end of the client's stream between messages to nil.
func eof(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
