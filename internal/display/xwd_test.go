package display

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"image/png"
	"testing"
)

// xwdFile builds an XWD file of w x h pixels from px (one uint32 a pixel),
// the way Xvfb lays it out.
func xwdFile(w, h, bpp int, order uint32, masks [3]uint32, px func(x, y int) uint32) []byte {
	name := []byte("Xvfb test:99.0\x00")
	bpl := w * bpp / 8
	hd := xwdHeader{HeaderSize: uint32(100 + len(name)), FileVersion: 7, PixmapFormat: 2, PixmapDepth: 24,
		PixmapWidth: uint32(w), PixmapHeight: uint32(h), ByteOrder: order, BitmapUnit: 32, BitmapPad: 32,
		BitsPerPixel: uint32(bpp), BytesPerLine: uint32(bpl), VisualClass: 4,
		RedMask: masks[0], GreenMask: masks[1], BlueMask: masks[2], BitsPerRGB: 8, ColormapEntries: 2, NColors: 2,
		WindowWidth: uint32(w), WindowHeight: uint32(h)}
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, hd)
	b.Write(name)
	b.Write(make([]byte, 2*12))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			v := px(x, y)
			p := make([]byte, bpp/8)
			for i := range p {
				if order == lsbFirst {
					p[i] = byte(v >> (8 * i))
				} else {
					p[len(p)-1-i] = byte(v >> (8 * i))
				}
			}
			b.Write(p)
		}
	}
	return b.Bytes()
}

func TestDecodeXWD(t *testing.T) {
	rgb := [3]uint32{0xff0000, 0xff00, 0xff}
	px := func(x, y int) uint32 { return uint32(x*40)<<16 | uint32(y*50)<<8 | 0x7f }
	for _, c := range []struct {
		name  string
		bpp   int
		order uint32
	}{{"32 bpp LSB first (Xvfb on x86)", 32, 0}, {"32 bpp MSB first", 32, 1}, {"24 bpp", 24, 0}} {
		img, err := DecodeXWD(bytes.NewReader(xwdFile(5, 3, c.bpp, c.order, rgb, px)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if img.Rect.Dx() != 5 || img.Rect.Dy() != 3 {
			t.Fatalf("%s: size %v", c.name, img.Rect)
		}
		if got, want := img.RGBAAt(4, 2), (color.RGBA{160, 100, 0x7f, 0xff}); got != want {
			t.Fatalf("%s: pixel (4,2) = %v, want %v", c.name, got, want)
		}
	}
	// 16 bpp, 5-6-5: full intensity stays full.
	img, err := DecodeXWD(bytes.NewReader(xwdFile(2, 1, 16, 0, [3]uint32{0xf800, 0x07e0, 0x001f},
		func(x, _ int) uint32 { return []uint32{0xffff, 0x0000}[x] })))
	if err != nil {
		t.Fatal(err)
	}
	if img.RGBAAt(0, 0) != (color.RGBA{255, 255, 255, 255}) || img.RGBAAt(1, 0) != (color.RGBA{0, 0, 0, 255}) {
		t.Fatalf("16 bpp: %v %v", img.RGBAAt(0, 0), img.RGBAAt(1, 0))
	}
}

func TestDecodeXWDRefuses(t *testing.T) {
	good := xwdFile(4, 4, 32, 0, [3]uint32{0xff0000, 0xff00, 0xff}, func(int, int) uint32 { return 0 })
	for name, mut := range map[string]func(b []byte){
		"truncated":      func(b []byte) {},
		"huge width":     func(b []byte) { binary.BigEndian.PutUint32(b[16:], 1<<30) },
		"short lines":    func(b []byte) { binary.BigEndian.PutUint32(b[48:], 4) },
		"huge header":    func(b []byte) { binary.BigEndian.PutUint32(b[0:], 1<<31) },
		"pseudo colour":  func(b []byte) { binary.BigEndian.PutUint32(b[52:], 3) },
		"12 bits/pixel":  func(b []byte) { binary.BigEndian.PutUint32(b[44:], 12) },
		"other version":  func(b []byte) { binary.BigEndian.PutUint32(b[4:], 6) },
		"no colour mask": func(b []byte) { binary.BigEndian.PutUint32(b[56:], 0) },
	} {
		b := append([]byte(nil), good...)
		mut(b)
		if name == "truncated" {
			b = b[:len(b)-10]
		}
		if _, err := DecodeXWD(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestScale(t *testing.T) {
	src := image.NewRGBA(image.Rect(0, 0, 4, 2))
	for x := 0; x < 4; x++ {
		for y := 0; y < 2; y++ {
			v := uint8(0)
			if x%2 == 1 {
				v = 200
			}
			src.SetRGBA(x, y, color.RGBA{v, v, v, 255})
		}
	}
	dst := Scale(src, 0.5)
	if dst.Rect.Dx() != 2 || dst.Rect.Dy() != 1 || dst.RGBAAt(0, 0) != (color.RGBA{100, 100, 100, 255}) {
		t.Fatalf("scaled: %v %v", dst.Rect, dst.RGBAAt(0, 0))
	}
	if Scale(src, 1) != src || Scale(src, 0) != src {
		t.Fatal("factor 1 (or nonsense) should keep the image")
	}
	var b bytes.Buffer
	if err := EncodePNG(&b, dst); err != nil {
		t.Fatal(err)
	}
	if back, err := png.Decode(&b); err != nil || back.Bounds().Dx() != 2 {
		t.Fatalf("png: %v", err)
	}
}

func FuzzDecodeXWD(f *testing.F) {
	f.Add(xwdFile(3, 2, 32, 0, [3]uint32{0xff0000, 0xff00, 0xff}, func(x, y int) uint32 { return uint32(x + y) }))
	f.Add(xwdFile(2, 2, 16, 1, [3]uint32{0xf800, 0x07e0, 0x001f}, func(x, y int) uint32 { return 0xabcd }))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := DecodeXWD(bytes.NewReader(b))
		if err == nil && (img.Rect.Dx() > MaxSide || img.Rect.Dy() > MaxSide) {
			t.Fatalf("size %v", img.Rect)
		}
	})
}
