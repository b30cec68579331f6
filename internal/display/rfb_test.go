package display

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func msg(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func u16(n int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(n)) }
func u32(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

func TestViewOnlyDropsInput(t *testing.T) {
	hello := []byte("RFB 003.008\n\x01\x01") // version, security None, shared
	view := msg(
		[]byte{0, 0, 0, 0}, make([]byte, 16), // SetPixelFormat
		[]byte{2, 0}, u16(2), u32(0), u32(0xffffff21), // SetEncodings
		[]byte{3, 1}, make([]byte, 8), // FramebufferUpdateRequest
		[]byte{248, 0, 0, 0}, u32(1), []byte{3, 'a', 'b', 'c'}, // ClientFence
		[]byte{150, 1}, make([]byte, 8), // EnableContinuousUpdates
	)
	input := msg(
		[]byte{4, 1, 0, 0}, u32(0x61), // KeyEvent 'a'
		[]byte{5, 1}, u16(10), u16(20), // PointerEvent
		[]byte{6, 0, 0, 0}, u32(22), []byte("file:///etc/agentvm/e"), []byte{'n'}, // ClientCutText
		[]byte{251, 0}, u16(800), u16(600), []byte{1, 0}, make([]byte, 16), // SetDesktopSize
		[]byte{255, 0}, u16(1), u32(0x61), u32(30), // QEMU extended key event
		[]byte{250, 0, 1, 4}, // xvp reboot
	)
	var out bytes.Buffer
	in := msg(hello, view[:20], input, view[20:], input)
	if err := ViewOnly(&out, bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if want := msg(hello, view); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("passed\n%q\nwant\n%q", out.Bytes(), want)
	}
	// VNC authentication's response passes.
	out.Reset()
	auth := msg([]byte("RFB 003.008\n\x02"), bytes.Repeat([]byte{7}, 16), []byte{1})
	if err := ViewOnly(&out, bytes.NewReader(msg(auth, input))); err != nil || !bytes.Equal(out.Bytes(), auth) {
		t.Fatalf("vnc auth: %v %q", err, out.Bytes())
	}
}

func TestViewOnlyRefusesWhatItCannotFrame(t *testing.T) {
	for name, in := range map[string][]byte{
		"RFB 3.3":          []byte("RFB 003.003\n\x01"),
		"not RFB":          []byte("GET / HTTP/1.1\r\n"),
		"unknown security": []byte("RFB 003.008\n\x10\x01"),
		"unknown message":  []byte("RFB 003.008\n\x01\x01\x07"),
		"long fence":       msg([]byte("RFB 003.008\n\x01\x01"), []byte{248, 0, 0, 0}, u32(0), []byte{200}),
		"QEMU audio":       msg([]byte("RFB 003.008\n\x01\x01"), []byte{255, 1, 0, 0}),
	} {
		var out bytes.Buffer
		if err := ViewOnly(&out, bytes.NewReader(in)); err == nil {
			t.Errorf("%s: passed %q", name, out.Bytes())
		}
	}
}
