package qemu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// RAMFile is where SplitState writes guest pages: a new file (an *os.File).
type RAMFile interface {
	io.WriterAt
	Truncate(size int64) error
}

// ramWriter writes pages to a RAM file at their offsets. Consecutive pages
// are gathered into one write; zero pages are left as holes, and a zero page
// for a page written earlier in the same save (a live save sends a page again
// when the guest dirtied it) punches the page out again.
type ramWriter struct {
	f       RAMFile
	size    int64
	written []uint64 // one bit per page: holds data
	buf     []byte   // pending run of pages
	start   int64    // offset of buf[0]
	n       int      // bytes of buf in use
}

const ramRun = 1 << 20 // bytes gathered per write

func newRAMWriter(f RAMFile, size int64) (*ramWriter, error) {
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("size the RAM file: %w", err)
	}
	return &ramWriter{f: f, size: size, written: make([]uint64, (size/pageSize+63)/64), buf: make([]byte, ramRun)}, nil
}

// page returns where the page at addr is to be read into; commit records it.
func (w *ramWriter) page(addr int64) ([]byte, error) {
	if w.n > 0 && (addr != w.start+int64(w.n) || w.n+pageSize > len(w.buf)) {
		if err := w.flush(); err != nil {
			return nil, err
		}
	}
	if w.n == 0 {
		w.start = addr
	}
	return w.buf[w.n : w.n+pageSize], nil
}

func (w *ramWriter) commit(addr int64) {
	w.n += pageSize
	i := addr / pageSize
	w.written[i/64] |= 1 << (i % 64)
}

func (w *ramWriter) flush() error {
	if w.n == 0 {
		return nil
	}
	_, err := w.f.WriteAt(w.buf[:w.n], w.start)
	w.n = 0
	if err != nil {
		return fmt.Errorf("write the RAM file: %w", err)
	}
	return nil
}

// zero makes the page at addr read as zeros.
func (w *ramWriter) zero(addr int64) error {
	i := addr / pageSize
	if w.written[i/64]&(1<<(i%64)) == 0 {
		return nil // never written: a hole already
	}
	if err := w.flush(); err != nil {
		return err
	}
	w.written[i/64] &^= 1 << (i % 64)
	if f, ok := w.f.(interface{ Fd() uintptr }); ok {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, addr, pageSize)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("punch a page out of the RAM file: %w", err)
		}
	}
	if _, err := w.f.WriteAt(zeroPage[:], addr); err != nil {
		return fmt.Errorf("write the RAM file: %w", err)
	}
	return nil
}

// State files in the page format start with this header, in place of the
// stream's own "QEVM": the RAM file is then the state's path plus
// RAMSuffix. A state that starts with "QEVM" is a whole stream (the stream
// format, and every state saved before the page format existed).
const (
	pagesMagic   = "AVMPAGES"
	pagesVersion = 1
	// magic, be32 version, be32 header length, be64 RAM size, be32 where
	// the main block's pages may go back into the stream (SplitStats.InjectAt;
	// its top bit: QEMU's sections end with footers), be32 the RAM section's
	// id. The last two are 0 in a state that does not know them.
	pagesHeaderLen = 32
	// RAMSuffix names a page-format state's RAM file: <state>.ram.
	RAMSuffix = ".ram"
)

// Save formats: how a save of a VM's own memory (suspend, snapshot, fork)
// is written, chosen per save by the caller. Templates are always a
// stream (their RAM file is shared instead).
const (
	FormatStream = "stream" // RAM and devices in one migration stream
	FormatPages  = "pages"  // RAM page for page in <state>.ram, beside the device state
)

// ValidFormat checks a save format.
func ValidFormat(f string) error {
	if f != FormatStream && f != FormatPages && f != FormatMapped {
		return fmt.Errorf("state format %q: want %s, %s or %s", f, FormatStream, FormatPages, FormatMapped)
	}
	return nil
}

func pagesHeader(ramSize int64, st SplitStats) []byte {
	h := make([]byte, pagesHeaderLen)
	copy(h, pagesMagic)
	h[11] = pagesVersion
	h[15] = pagesHeaderLen
	binary.BigEndian.PutUint64(h[16:], uint64(ramSize))
	if st.InjectAt > 0 && st.InjectAt < 1<<31 {
		at := uint32(st.InjectAt)
		if st.Footers {
			at |= 1 << 31
		}
		binary.BigEndian.PutUint32(h[24:], at)
		binary.BigEndian.PutUint32(h[28:], st.RAMSection)
	}
	return h
}

// ErrRAMFileLost: a page-format state's RAM file is missing.
var ErrRAMFileLost = errors.New("its RAM file is gone")

// StateInfo is what a state file's first bytes say about it.
type StateInfo struct {
	Format  string // FormatStream, FormatPages or FormatMapped
	RAMPath string // pages: the RAM file
	RAMSize int64  // pages: the guest RAM size it holds
	Offset  int64  // where QEMU's stream starts in the file
	// pages: where the RAM file's pages may be put back into the stream for
	// a restore into anonymous memory (0: not known; see writeEager).
	InjectAt   int64
	RAMSection uint32
	Footers    bool
}

// ReadStateInfo reads the format of the state at path. A page-format
// state's RAM file must be there, of the size recorded.
func ReadStateInfo(path string) (StateInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return StateInfo{}, err
	}
	defer f.Close()
	h := make([]byte, pagesHeaderLen)
	n, err := io.ReadFull(f, h)
	if n >= 4 && string(h[:4]) == "QEVM" {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return StateInfo{}, err
		}
		// A stream this cannot read is QEMU's to refuse, with its reason.
		if caps, _ := streamCapabilities(f); slices.Contains(caps, "mapped-ram") {
			return StateInfo{Format: FormatMapped}, nil
		}
		return StateInfo{Format: FormatStream}, nil
	}
	if err != nil || string(h[:8]) != pagesMagic {
		return StateInfo{}, fmt.Errorf("state file %s is neither a migration stream nor a page-format state", path)
	}
	if h[8] != 0 || h[9] != 0 || h[10] != 0 || h[11] != pagesVersion || h[15] != pagesHeaderLen {
		return StateInfo{}, fmt.Errorf("state file %s: page format version %d not known to this agentvm", path, h[11])
	}
	size := int64(binary.BigEndian.Uint64(h[16:]))
	at := binary.BigEndian.Uint32(h[24:])
	info := StateInfo{Format: FormatPages, RAMPath: path + RAMSuffix, RAMSize: size, Offset: pagesHeaderLen,
		InjectAt: int64(at &^ (1 << 31)), Footers: at&(1<<31) != 0, RAMSection: binary.BigEndian.Uint32(h[28:])}
	if size <= 0 || size&pageMask != 0 {
		return StateInfo{}, fmt.Errorf("state file %s: RAM size %d is not a whole number of pages", path, size)
	}
	st, err := os.Stat(info.RAMPath)
	if err != nil {
		return StateInfo{}, fmt.Errorf("state file %s: %w: %v", path, ErrRAMFileLost, err)
	}
	if st.Size() != size {
		return StateInfo{}, fmt.Errorf("state file %s: its RAM file holds %d bytes, the state says %d", path, st.Size(), size)
	}
	return info, nil
}

// RemoveState deletes a state file and its RAM file, if any. A QEMU that
// maps the RAM file keeps it (its inode) until it exits.
func RemoveState(path string) {
	os.Remove(path + RAMSuffix)
	os.Remove(path)
	os.Remove(path + SyncedSuffix)
}

// RenameState moves a state to a new path, its RAM file first: a state file
// found at the new path always has its RAM file beside it. A RAM file left
// at the new path by an older state of the stream format goes.
func RenameState(from, to string) error {
	if _, err := os.Stat(from + RAMSuffix); err == nil {
		if err := os.Rename(from+RAMSuffix, to+RAMSuffix); err != nil {
			return err
		}
	} else {
		os.Remove(to + RAMSuffix)
	}
	return os.Rename(from, to)
}

// DiskUsage is the disk space a state takes (its RAM file included),
// counted in allocated blocks: a RAM file's holes take none.
func DiskUsage(path string) int64 {
	var n int64
	for _, p := range []string{path, path + RAMSuffix} {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}
