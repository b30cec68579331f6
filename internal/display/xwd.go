// Package display makes PNG screenshots of a VM's X display from the XWD
// file Xvfb keeps its screen in (-fbdir), read from the guest as bytes. The
// guest is not trusted: every size in the file is bounded before use.
package display

import (
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math/bits"
)

// MaxSide bounds the width and height accepted from a framebuffer file.
const MaxSide = 4096

// xwdHeader is the fixed part of an XWD (X Window Dump, version 7) header:
// 25 big-endian 32-bit fields, then the window name up to HeaderSize, then
// NColors 12-byte colour map entries, then the pixels.
type xwdHeader struct {
	HeaderSize, FileVersion, PixmapFormat, PixmapDepth, PixmapWidth, PixmapHeight, XOffset,
	ByteOrder, BitmapUnit, BitmapBitOrder, BitmapPad, BitsPerPixel, BytesPerLine, VisualClass,
	RedMask, GreenMask, BlueMask, BitsPerRGB, ColormapEntries, NColors,
	WindowWidth, WindowHeight, WindowX, WindowY, WindowBorderWidth uint32
}

const (
	xwdVersion = 7
	zPixmap    = 2
	lsbFirst   = 0
	trueColor  = 4
	directCol  = 5
)

// DecodeXWD reads a true-colour ZPixmap XWD image (what Xvfb writes at
// depth 15, 16 or 24) into RGBA.
func DecodeXWD(r io.Reader) (*image.RGBA, error) { return DecodeXWDReserving(r, nil) }

// DecodeXWDReserving is DecodeXWD, calling reserve with the image's size
// once the header is checked and before the image is allocated: an error
// from it ends the decode (the caller's memory budget has no room).
func DecodeXWDReserving(r io.Reader, reserve func(width, height int) error) (*image.RGBA, error) {
	var h xwdHeader
	if err := binary.Read(r, binary.BigEndian, &h); err != nil {
		return nil, fmt.Errorf("xwd header: %w", err)
	}
	switch {
	case h.FileVersion != xwdVersion:
		return nil, fmt.Errorf("xwd: version %d, want %d", h.FileVersion, xwdVersion)
	case h.PixmapFormat != zPixmap:
		return nil, fmt.Errorf("xwd: pixmap format %d, want ZPixmap", h.PixmapFormat)
	case h.VisualClass != trueColor && h.VisualClass != directCol:
		return nil, fmt.Errorf("xwd: visual class %d, want TrueColor", h.VisualClass)
	case h.PixmapWidth == 0 || h.PixmapHeight == 0 || h.PixmapWidth > MaxSide || h.PixmapHeight > MaxSide:
		return nil, fmt.Errorf("xwd: size %dx%d out of range", h.PixmapWidth, h.PixmapHeight)
	case h.BitsPerPixel != 16 && h.BitsPerPixel != 24 && h.BitsPerPixel != 32:
		return nil, fmt.Errorf("xwd: %d bits per pixel", h.BitsPerPixel)
	case h.HeaderSize < 100 || h.HeaderSize > 4096 || h.NColors > 65536:
		return nil, fmt.Errorf("xwd: header size %d, %d colours", h.HeaderSize, h.NColors)
	case h.RedMask == 0 || h.GreenMask == 0 || h.BlueMask == 0:
		return nil, errors.New("xwd: no colour masks")
	}
	w, ht, bpp := int(h.PixmapWidth), int(h.PixmapHeight), int(h.BitsPerPixel)/8
	bpl := int(h.BytesPerLine)
	if bpl < w*bpp || bpl > w*bpp+64 {
		return nil, fmt.Errorf("xwd: %d bytes per line for %d pixels of %d bytes", bpl, w, bpp)
	}
	// Skip the window name and the colour map: a true-colour image does not use it.
	if _, err := io.CopyN(io.Discard, r, int64(h.HeaderSize)-100+int64(h.NColors)*12); err != nil {
		return nil, fmt.Errorf("xwd header: %w", err)
	}
	if reserve != nil {
		if err := reserve(w, ht); err != nil {
			return nil, err
		}
	}
	chans := [3]channel{newChannel(h.RedMask), newChannel(h.GreenMask), newChannel(h.BlueMask)}
	img := image.NewRGBA(image.Rect(0, 0, w, ht))
	line := make([]byte, bpl)
	for y := 0; y < ht; y++ {
		if _, err := io.ReadFull(r, line); err != nil {
			return nil, fmt.Errorf("xwd: line %d of %d: %w", y, ht, err)
		}
		out := img.Pix[y*img.Stride : y*img.Stride+w*4]
		for x := 0; x < w; x++ {
			p := line[x*bpp : x*bpp+bpp]
			var v uint32
			if h.ByteOrder == lsbFirst {
				for i := bpp - 1; i >= 0; i-- {
					v = v<<8 | uint32(p[i])
				}
			} else {
				for i := 0; i < bpp; i++ {
					v = v<<8 | uint32(p[i])
				}
			}
			o := out[x*4 : x*4+4]
			o[0], o[1], o[2], o[3] = chans[0].get(v), chans[1].get(v), chans[2].get(v), 0xff
		}
	}
	return img, nil
}

// channel extracts one colour from a pixel by its mask, widened to 8 bits.
type channel struct {
	mask  uint32
	shift int
	width int
}

func newChannel(mask uint32) channel {
	return channel{mask: mask, shift: bits.TrailingZeros32(mask), width: bits.OnesCount32(mask)}
}

func (c channel) get(v uint32) uint8 {
	x := (v & c.mask) >> c.shift
	switch {
	case c.width == 8:
		return uint8(x)
	case c.width > 8:
		return uint8(x >> (c.width - 8))
	default: // replicate the top bits into the low ones (5 bits: abcde -> abcdeabc)
		out := x << (8 - c.width)
		for s := c.width; s < 8; s += c.width {
			out |= x << (8 - c.width) >> s
		}
		return uint8(out)
	}
}

// Scale shrinks img by f (0 < f <= 1) averaging the source pixels each
// destination pixel covers; f >= 1 returns img.
func Scale(img *image.RGBA, f float64) *image.RGBA {
	if f >= 1 || f <= 0 {
		return img
	}
	sw, sh := img.Rect.Dx(), img.Rect.Dy()
	dw, dh := max(1, int(float64(sw)*f+0.5)), max(1, int(float64(sh)*f+0.5))
	dst := image.NewRGBA(image.Rect(0, 0, dw, dh))
	for dy := 0; dy < dh; dy++ {
		y0, y1 := dy*sh/dh, max((dy+1)*sh/dh, dy*sh/dh+1)
		for dx := 0; dx < dw; dx++ {
			x0, x1 := dx*sw/dw, max((dx+1)*sw/dw, dx*sw/dw+1)
			var sum [4]int
			for y := y0; y < y1; y++ {
				row := img.Pix[y*img.Stride:]
				for x := x0; x < x1; x++ {
					p := row[x*4 : x*4+4]
					sum[0] += int(p[0])
					sum[1] += int(p[1])
					sum[2] += int(p[2])
					sum[3] += int(p[3])
				}
			}
			n := (y1 - y0) * (x1 - x0)
			o := dst.Pix[dy*dst.Stride+dx*4:]
			o[0], o[1], o[2], o[3] = uint8(sum[0]/n), uint8(sum[1]/n), uint8(sum[2]/n), uint8(sum[3]/n)
		}
	}
	return dst
}

// EncodePNG writes img as PNG, favouring speed over size (a screenshot is
// made on request, usually looked at once).
func EncodePNG(w io.Writer, img image.Image) error {
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	return enc.Encode(w, img)
}
