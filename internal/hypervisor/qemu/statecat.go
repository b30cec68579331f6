package qemu

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// StateCatArg is the argument that selects CatState in the agentvm binary.
const StateCatArg = "__state-cat"

// stateReader is the command QEMU runs (migrate-incoming "exec:") to read a
// state file into its migration pipe: Config.StateCat's state-cat mode
// (CatState), or plain cat, which works too, only slower.
func (c *Config) stateReader() []string {
	if c.StateCat == "" {
		return []string{"cat"}
	}
	return []string{c.StateCat, StateCatArg}
}

// CatState writes the file at path to stdout, a pipe to QEMU: it grows the
// pipe to 1 MiB and moves pages with splice(2), where cat copies 128 KiB at a
// time through a 64 KiB pipe. Restores of a few hundred MiB wait on this.
func CatState(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// A page-format state: QEMU's stream starts after the header.
	h := make([]byte, pagesHeaderLen)
	if n, _ := io.ReadFull(f, h); n == pagesHeaderLen && string(h[:len(pagesMagic)]) == pagesMagic {
		if _, err := f.Seek(pagesHeaderLen, io.SeekStart); err != nil {
			return err
		}
	} else if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	unix.FcntlInt(1, unix.F_SETPIPE_SZ, 1<<20) // best effort: the limit may be lower
	for {
		n, err := unix.Splice(int(f.Fd()), nil, 1, nil, 1<<20, unix.SPLICE_F_MORE)
		switch {
		case err == nil && n == 0:
			return nil
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL): // stdout is not a pipe
			_, err = io.Copy(os.Stdout, f)
			return err
		case err != nil:
			return err
		}
	}
}

// StateCatEagerArg selects CatStateEager in the agentvm binary.
const StateCatEagerArg = "__state-cat-eager"

// CatStateEager writes a page-format state at path to stdout as one plain
// migration stream (writeEager), for a restore into anonymous memory.
func CatStateEager(path string) error {
	unix.FcntlInt(1, unix.F_SETPIPE_SZ, 1<<20) // best effort
	return writeEager(os.Stdout, path)
}

// writeEager writes the page-format state at path as the migration stream
// QEMU would load whole: the state's stream with the main RAM block's
// pages put back right after the RAM section's start, as one more part of
// that section. Only the RAM file's data is read (SEEK_DATA/SEEK_HOLE), and
// all-zero pages are left out: the restoring QEMU's fresh memory is zero.
// So the restore costs what the guest uses, not its memory size, and the
// guest's memory is then its QEMU's own: a later save reads untouched
// pages as cheaply as a never-restored VM's (reading a hole of a mapped
// sparse file allocates a page of page cache, which made a save of a 4 GiB
// VM restored by mapping its RAM file several times slower).
func writeEager(out io.Writer, path string) error {
	info, err := ReadStateInfo(path)
	if err != nil {
		return err
	}
	if info.Format != FormatPages || info.InjectAt <= 0 {
		return fmt.Errorf("state file %s does not say where its RAM pages go", path)
	}
	state, err := os.Open(path)
	if err != nil {
		return err
	}
	defer state.Close()
	ram, err := os.Open(info.RAMPath)
	if err != nil {
		return err
	}
	defer ram.Close()
	w := bufio.NewWriterSize(out, 1<<20)
	if _, err := io.Copy(w, io.NewSectionReader(state, info.Offset, info.InjectAt)); err != nil {
		return err
	}
	var hdr [9]byte
	hdr[0] = secPart
	binary.BigEndian.PutUint32(hdr[1:5], info.RAMSection)
	w.Write(hdr[:5])
	named := false
	buf := make([]byte, 1<<20)
	fd := int(ram.Fd())
	for off := int64(0); off < info.RAMSize; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data after off
		}
		if err != nil {
			return fmt.Errorf("RAM file %s: %w", info.RAMPath, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("RAM file %s: %w", info.RAMPath, err)
		}
		hole = min(hole, info.RAMSize)
		for p := data &^ pageMask; p < hole; {
			n := min(int64(len(buf)), (hole-p+pageMask)&^pageMask, info.RAMSize-p)
			if _, err := ram.ReadAt(buf[:n], p); err != nil {
				return fmt.Errorf("RAM file %s: %w", info.RAMPath, err)
			}
			for i := int64(0); i < n; i += pageSize {
				page := buf[i : i+pageSize]
				if bytes.Equal(page, zeroPage[:]) {
					continue
				}
				flags := uint64(ramFlagPage)
				if named {
					flags |= ramFlagContinue
				}
				binary.BigEndian.PutUint64(hdr[:8], uint64(p+i)|flags)
				w.Write(hdr[:8])
				if !named {
					w.WriteByte(byte(len(MainRAMBlock)))
					w.WriteString(MainRAMBlock)
					named = true
				}
				w.Write(page)
			}
			p += n
		}
		off = hole
	}
	binary.BigEndian.PutUint64(hdr[:8], ramFlagEOS)
	w.Write(hdr[:8])
	if info.Footers {
		hdr[0] = secFooter
		binary.BigEndian.PutUint32(hdr[1:5], info.RAMSection)
		w.Write(hdr[:5])
	}
	if _, err := io.Copy(w, io.NewSectionReader(state, info.Offset+info.InjectAt, 1<<62)); err != nil {
		return err
	}
	return w.Flush()
}
