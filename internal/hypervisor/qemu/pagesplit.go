package qemu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The page format ("pages") keeps a VM's saved memory the way the template
// keeps its RAM: page for page in a file that a restore maps copy-on-write
// (memory-backend-file, share=off), so that a restore reads only the pages
// the guest touches. QEMU 7.2 cannot write such a file itself (mapped-ram
// came in 9.0), so the daemon reads QEMU's ordinary migration stream and
// splits it (SplitState): the pages of the main RAM block go to the RAM
// file, everything else, unchanged, to a small state file that QEMU loads
// on the restore. The main block is still listed in the stream's RAM block
// list but receives no page: QEMU keeps what the mapped file holds.
//
// What the splitter reads (QEMU's migration/savevm.c and migration/ram.c,
// the same from 7.2 to 10.x for the parts used here):
//
//	file header      be32 "QEVM", be32 version 3
//	configuration    0x07, be32 len + machine type, then subsections:
//	                 0x05, u8 len + name, be32 version, fields
//	section start    0x01, be32 section id, u8 len + idstr, be32 instance, be32 version
//	section part/end 0x02/0x03, be32 section id
//	section footer   0x7e, be32 section id
//	full section     0x04 + header as start: a device's vmstate, not self-delimiting;
//	                 from the first one on the rest is copied as is
//	command          0x08, be16 command, be16 len + data
//	eof              0x00 (a JSON description may follow: copied as is)
//
// and in the "ram" section, records of be64 (offset | flags):
//
//	MEM_SIZE  total size; then per block u8 len + idstr, be64 length
//	ZERO      [u8 len + idstr unless CONTINUE], u8 fill byte
//	PAGE      [u8 len + idstr unless CONTINUE], one target page
//	EOS       end of the section's records
//	MULTIFD_FLUSH (no payload)
//
// Anything else (XBZRLE, compression, RDMA hooks, postcopy's block fields,
// another iterative section, a fill byte other than 0) is refused with
// ErrUnsupportedStream: the caller then saves in the plain stream format.

const (
	vmFileMagic   = 0x5145564d // "QEVM"
	vmFileVersion = 3

	secEOF           = 0x00
	secStart         = 0x01
	secPart          = 0x02
	secEnd           = 0x03
	secFull          = 0x04
	secSubsection    = 0x05
	secConfiguration = 0x07
	secCommand       = 0x08
	secFooter        = 0x7e

	ramFlagZero         = 0x002
	ramFlagMemSize      = 0x004
	ramFlagPage         = 0x008
	ramFlagEOS          = 0x010
	ramFlagContinue     = 0x020
	ramFlagMultifdFlush = 0x200

	pageSize = 4096 // x86's target page
	pageMask = pageSize - 1
)

// zeroPage is a page of zeros (read only).
var zeroPage [pageSize]byte

// MainRAMBlock is the RAM block of the guest's memory backend (-object
// memory-backend-*,id=mem): the only block whose pages go to the RAM file.
const MainRAMBlock = "mem"

// ErrUnsupportedStream: the migration stream holds something the page
// splitter does not know; the save must be made in the stream format.
var ErrUnsupportedStream = errors.New("migration stream not understood by the page splitter")

// SplitStats describes a split.
type SplitStats struct {
	Pages      int64 // pages of the main block written to the RAM file (rewrites included)
	ZeroPages  int64 // zero pages of the main block (holes in the file)
	StateBytes int64 // bytes written to the state stream
	// Where a restore may insert the main block's pages into the state
	// stream (writeEager): the offset right after the RAM section's start
	// (its block list, EOS and footer), the RAM section's id, and whether
	// QEMU ends sections with footers.
	InjectAt   int64
	RAMSection uint32
	Footers    bool
}

// splitter is one pass over a migration stream.
type splitter struct {
	in       *bufio.Reader
	out      *bufio.Writer
	ram      *ramWriter
	mainSize int64
	blocks   map[string]int64 // RAM block lengths from the MEM_SIZE list
	ramID    uint32           // section id of "ram"
	ramState int              // 0 not started, 1 started, 2 ended
	cur      string           // block of the last page record (for CONTINUE)
	haveCur  bool
	stats    SplitStats
	scratch  [256]byte
	written  *countWriter // what reached the state, before out's buffer
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// SplitState reads QEMU's outgoing migration stream from in and writes the
// pages of the main RAM block (MainRAMBlock, which must be ramSize bytes) to
// ram at their offsets, and the rest of the stream to state. ram must be a
// new, empty file: it is sized to ramSize and zero pages stay holes.
// On an error the outputs are incomplete and must be discarded; the stream
// is not read to its end.
func SplitState(in io.Reader, state io.Writer, ram RAMFile, ramSize int64) (SplitStats, error) {
	if ramSize <= 0 || ramSize&pageMask != 0 {
		return SplitStats{}, fmt.Errorf("RAM size %d is not a whole number of pages", ramSize)
	}
	rw, err := newRAMWriter(ram, ramSize)
	if err != nil {
		return SplitStats{}, err
	}
	cw := &countWriter{w: state}
	s := &splitter{in: bufio.NewReaderSize(in, 1<<20), out: bufio.NewWriterSize(cw, 256<<10), ram: rw, mainSize: ramSize, written: cw}
	err = s.run()
	if ferr := rw.flush(); err == nil {
		err = ferr
	}
	if ferr := s.out.Flush(); err == nil {
		err = ferr
	}
	s.stats.StateBytes = cw.n
	return s.stats, err
}

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupportedStream, fmt.Sprintf(format, a...))
}

// errTruncated: the stream ended early, which is how the splitter sees a
// migration that QEMU gave up.
var errTruncated = errors.New("migration stream ends early")

// truncated turns an EOF in the middle of an item into an error that says so.
func truncated(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: inside %s", errTruncated, what)
	}
	return err
}

// read reads exactly len(p) bytes, copying them to the state when keep.
func (s *splitter) read(p []byte, keep bool, what string) error {
	if _, err := io.ReadFull(s.in, p); err != nil {
		return truncated(err, what)
	}
	if keep {
		_, err := s.out.Write(p)
		return err
	}
	return nil
}

func (s *splitter) u8(keep bool, what string) (byte, error) {
	if err := s.read(s.scratch[:1], keep, what); err != nil {
		return 0, err
	}
	return s.scratch[0], nil
}

func (s *splitter) be32(keep bool, what string) (uint32, error) {
	if err := s.read(s.scratch[:4], keep, what); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(s.scratch[:4]), nil
}

func (s *splitter) be64(keep bool, what string) (uint64, error) {
	if err := s.read(s.scratch[:8], keep, what); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(s.scratch[:8]), nil
}

// str reads a u8-length string.
func (s *splitter) str(keep bool, what string) (string, error) {
	n, err := s.u8(keep, what)
	if err != nil {
		return "", err
	}
	buf := make([]byte, n)
	if err := s.read(buf, keep, what); err != nil {
		return "", err
	}
	return string(buf), nil
}

func (s *splitter) run() error {
	magic, err := s.be32(true, "the file header")
	if err != nil {
		return err
	}
	version, err := s.be32(true, "the file header")
	if err != nil {
		return err
	}
	if magic != vmFileMagic || version != vmFileVersion {
		return unsupported("file header %#x version %d", magic, version)
	}
	for {
		t, err := s.in.ReadByte()
		if err != nil {
			return truncated(err, "its sections (no end marker)")
		}
		if err := s.out.WriteByte(t); err != nil {
			return err
		}
		switch t {
		case secConfiguration:
			err = s.configuration()
		case secStart:
			err = s.sectionStart()
		case secPart, secEnd:
			err = s.sectionPart(t)
		case secCommand:
			err = s.command()
		case secFull, secEOF:
			// Device state is not self-delimiting: from here on the stream is
			// copied as is. All RAM must have been seen by now.
			if s.ramState != 2 {
				return unsupported("device or end section %#x before the RAM section ended", t)
			}
			if _, err := io.Copy(s.out, s.in); err != nil {
				return err
			}
			return nil
		default:
			return unsupported("section type %#x", t)
		}
		if err != nil {
			return err
		}
	}
}

// configuration reads the configuration section: the machine type, then
// the subsections QEMU may send.
func (s *splitter) configuration() error {
	n, err := s.be32(true, "the configuration")
	if err != nil {
		return err
	}
	if n > 256 {
		return unsupported("machine type name of %d bytes", n)
	}
	if err := s.read(make([]byte, n), true, "the configuration"); err != nil {
		return err
	}
	for {
		b, err := s.in.Peek(1)
		if err != nil {
			return truncated(err, "the configuration")
		}
		if b[0] != secSubsection {
			return nil
		}
		s.u8(true, "a subsection")
		name, err := s.str(true, "a subsection")
		if err != nil {
			return err
		}
		if _, err := s.be32(true, "a subsection"); err != nil {
			return err
		}
		switch name {
		case "configuration/target-page-bits":
			bits, err := s.be32(true, name)
			if err != nil {
				return err
			}
			if 1<<bits != pageSize {
				return unsupported("target page bits %d", bits)
			}
		case "configuration/capabilities":
			count, err := s.be32(true, name)
			if err != nil {
				return err
			}
			if count > 64 {
				return unsupported("%d capabilities", count)
			}
			for i := uint32(0); i < count; i++ {
				c, err := s.str(true, name)
				if err != nil {
					return err
				}
				switch c {
				case "x-ignore-shared", "postcopy-ram", "mapped-ram":
					// They change the RAM records this splitter reads.
					return unsupported("capability %s", c)
				}
			}
		case "configuration/uuid":
			if err := s.read(make([]byte, 16), true, name); err != nil {
				return err
			}
		default:
			return unsupported("configuration subsection %q", name)
		}
	}
}

func (s *splitter) command() error {
	if err := s.read(s.scratch[:2], true, "a command"); err != nil {
		return err
	}
	var l [2]byte
	if err := s.read(l[:], true, "a command"); err != nil {
		return err
	}
	return s.read(make([]byte, binary.BigEndian.Uint16(l[:])), true, "a command")
}

func (s *splitter) sectionStart() error {
	id, err := s.be32(true, "a section header")
	if err != nil {
		return err
	}
	name, err := s.str(true, "a section header")
	if err != nil {
		return err
	}
	if err := s.read(s.scratch[:8], true, "a section header"); err != nil { // instance, version
		return err
	}
	if name != "ram" {
		return unsupported("iterative section %q", name)
	}
	if s.ramState != 0 {
		return unsupported("the RAM section started twice")
	}
	s.ramID, s.ramState = id, 1
	if err := s.blockList(); err != nil {
		return err
	}
	if err := s.records(); err != nil {
		return err
	}
	s.stats.InjectAt = s.written.n + int64(s.out.Buffered())
	s.stats.RAMSection = id
	return nil
}

func (s *splitter) sectionPart(t byte) error {
	id, err := s.be32(true, "a section header")
	if err != nil {
		return err
	}
	if s.ramState != 1 || id != s.ramID {
		return unsupported("section %d continued (type %#x) outside the RAM section", id, t)
	}
	if t == secEnd {
		s.ramState = 2
	}
	return s.records()
}

// blockList reads the MEM_SIZE record of the RAM section's start.
func (s *splitter) blockList() error {
	h, err := s.be64(true, "the RAM block list")
	if err != nil {
		return err
	}
	if h&pageMask != ramFlagMemSize {
		return unsupported("RAM section starts with flags %#x", h&pageMask)
	}
	total := h &^ pageMask
	s.blocks = map[string]int64{}
	for total > 0 {
		name, err := s.str(true, "the RAM block list")
		if err != nil {
			return err
		}
		length, err := s.be64(true, "the RAM block list")
		if err != nil {
			return err
		}
		if name == "" || length == 0 || length > total || length&pageMask != 0 {
			return unsupported("RAM block %q of %d bytes listed (of %d left)", name, length, total)
		}
		if _, dup := s.blocks[name]; dup {
			return unsupported("RAM block %q listed twice", name)
		}
		s.blocks[name] = int64(length)
		total -= length
	}
	if got, ok := s.blocks[MainRAMBlock]; !ok || got != s.mainSize {
		return unsupported("main RAM block %q is %d bytes, want %d", MainRAMBlock, got, s.mainSize)
	}
	return nil
}

// records reads a RAM section's records up to its EOS and the section footer.
func (s *splitter) records() error {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(s.in, hdr[:]); err != nil {
			return truncated(err, "the RAM section")
		}
		h := binary.BigEndian.Uint64(hdr[:])
		addr, flags := int64(h&^pageMask), h&pageMask
		if flags == ramFlagEOS && addr == 0 {
			if _, err := s.out.Write(hdr[:]); err != nil {
				return err
			}
			return s.footer()
		}
		if flags == ramFlagMultifdFlush && addr == 0 {
			if _, err := s.out.Write(hdr[:]); err != nil {
				return err
			}
			continue
		}
		kind := flags &^ ramFlagContinue
		if kind != ramFlagZero && kind != ramFlagPage {
			return unsupported("RAM record flags %#x", flags)
		}
		block := s.cur
		var name string
		if flags&ramFlagContinue == 0 {
			var err error
			if name, err = s.str(false, "a RAM record"); err != nil {
				return err
			}
			block = name
		} else if !s.haveCur {
			return unsupported("a RAM block continued before one was named")
		}
		length, ok := s.blocks[block]
		if !ok {
			return unsupported("a page of unknown RAM block %q", block)
		}
		if addr < 0 || addr+pageSize > length {
			return unsupported("a page at %#x of RAM block %q (%d bytes)", uint64(addr), block, length)
		}
		s.cur, s.haveCur = block, true
		main := block == MainRAMBlock
		if !main { // kept as it came
			if _, err := s.out.Write(hdr[:]); err != nil {
				return err
			}
			if flags&ramFlagContinue == 0 {
				s.out.WriteByte(byte(len(name)))
				s.out.WriteString(name)
			}
		}
		switch {
		case kind == ramFlagZero:
			fill, err := s.u8(!main, "a zero page")
			if err != nil {
				return err
			}
			if main {
				if fill != 0 {
					return unsupported("page filled with %#x", fill)
				}
				if err := s.ram.zero(addr); err != nil {
					return err
				}
				s.stats.ZeroPages++
			}
		case main:
			buf, err := s.ram.page(addr)
			if err != nil {
				return err
			}
			if _, err := io.ReadFull(s.in, buf); err != nil {
				return truncated(err, "a page")
			}
			s.ram.commit(addr)
			s.stats.Pages++
		default:
			if _, err := io.CopyN(s.out, s.in, pageSize); err != nil {
				return truncated(err, "a page")
			}
		}
	}
}

// footer reads the optional section footer after a RAM section's EOS.
func (s *splitter) footer() error {
	b, err := s.in.Peek(1)
	if err != nil {
		return truncated(err, "the RAM section")
	}
	if b[0] != secFooter {
		return nil
	}
	s.stats.Footers = true
	s.u8(true, "a section footer")
	id, err := s.be32(true, "a section footer")
	if err != nil {
		return err
	}
	if id != s.ramID {
		return unsupported("footer of section %d ends section %d", id, s.ramID)
	}
	return nil
}
