// Package fsdiff tells what changed on a VM's disk between two points of
// its qcow2 chain, from the host and without running anything in the
// guest: it reads the chain's files itself (qcow2.go), the ext4 file
// system in them (ext4.go), and compares the two trees (diff.go), skipping
// what lies only in clusters no layer above the older point wrote.
//
// The qcow2 files are the host's (QEMU writes them); the file system in
// them is the guest's, and hostile: every size, count, offset and depth it
// gives is bounded before it is used.
package fsdiff

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// qcowFile is one image of a chain.
type qcowFile struct {
	path        string
	f           *os.File
	clusterBits uint32
	size        uint64
	l1          []uint64
	backing     string

	mu  sync.Mutex
	l2s map[uint64][]uint64 // L2 table offset -> its entries (a small cache)
}

const (
	qcowMagic       = 0x514649fb
	l1OffsetMask    = 0x00fffffffffffe00
	l2OffsetMask    = 0x00fffffffffffe00
	l2Compressed    = 1 << 62
	l2Zero          = 1
	maxL1Entries    = 1 << 22 // 32 MiB of L1: far beyond an 8 TiB disk
	maxChainLength  = 64
	incompatDirty   = 1 << 0
	incompatCorrupt = 1 << 1
)

func openQcow(path string) (*qcowFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	q, err := readQcowHeader(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return q, nil
}

func readQcowHeader(f *os.File, path string) (*qcowFile, error) {
	var h [104]byte
	if _, err := f.ReadAt(h[:72], 0); err != nil {
		return nil, fmt.Errorf("%s: qcow2 header: %w", path, err)
	}
	be := binary.BigEndian
	if be.Uint32(h[0:]) != qcowMagic {
		return nil, fmt.Errorf("%s: not a qcow2 image", path)
	}
	version := be.Uint32(h[4:])
	if version != 2 && version != 3 {
		return nil, fmt.Errorf("%s: qcow2 version %d", path, version)
	}
	q := &qcowFile{path: path, f: f, clusterBits: be.Uint32(h[20:]), size: be.Uint64(h[24:]), l2s: map[uint64][]uint64{}}
	if q.clusterBits < 9 || q.clusterBits > 21 {
		return nil, fmt.Errorf("%s: cluster bits %d", path, q.clusterBits)
	}
	if be.Uint32(h[32:]) != 0 {
		return nil, fmt.Errorf("%s: an encrypted image", path)
	}
	if version == 3 {
		if _, err := f.ReadAt(h[72:104], 72); err != nil {
			return nil, fmt.Errorf("%s: qcow2 header: %w", path, err)
		}
		if inc := be.Uint64(h[72:]); inc&^uint64(incompatDirty|incompatCorrupt) != 0 {
			return nil, fmt.Errorf("%s: qcow2 features this reader does not know (%#x)", path, inc)
		} else if inc&incompatCorrupt != 0 {
			return nil, fmt.Errorf("%s: the image is marked corrupt", path)
		}
	}
	l1n := be.Uint32(h[36:])
	if l1n > maxL1Entries {
		return nil, fmt.Errorf("%s: %d L1 entries", path, l1n)
	}
	raw := make([]byte, 8*int(l1n))
	if _, err := f.ReadAt(raw, int64(be.Uint64(h[40:]))); err != nil {
		return nil, fmt.Errorf("%s: L1 table: %w", path, err)
	}
	q.l1 = make([]uint64, l1n)
	for i := range q.l1 {
		q.l1[i] = be.Uint64(raw[8*i:])
	}
	if off, n := be.Uint64(h[8:]), be.Uint32(h[16:]); off != 0 && n > 0 {
		if n > 1023 {
			return nil, fmt.Errorf("%s: backing file name of %d bytes", path, n)
		}
		name := make([]byte, n)
		if _, err := f.ReadAt(name, int64(off)); err != nil {
			return nil, fmt.Errorf("%s: backing file name: %w", path, err)
		}
		q.backing = string(name)
		if !filepath.IsAbs(q.backing) {
			q.backing = filepath.Join(filepath.Dir(path), q.backing)
		}
	}
	return q, nil
}

func (q *qcowFile) clusterSize() int64 { return 1 << q.clusterBits }

// l2Entry is the L2 entry of the guest cluster holding off (0: none).
func (q *qcowFile) l2Entry(off uint64) (uint64, error) {
	l2Bits := q.clusterBits - 3
	idx := off >> q.clusterBits
	l1i := idx >> l2Bits
	if l1i >= uint64(len(q.l1)) {
		return 0, nil
	}
	l2off := q.l1[l1i] & l1OffsetMask
	if l2off == 0 {
		return 0, nil
	}
	q.mu.Lock()
	tab, ok := q.l2s[l2off]
	q.mu.Unlock()
	if !ok {
		raw := make([]byte, q.clusterSize())
		if _, err := q.f.ReadAt(raw, int64(l2off)); err != nil {
			return 0, fmt.Errorf("%s: L2 table: %w", q.path, err)
		}
		tab = make([]uint64, len(raw)/8)
		for i := range tab {
			tab[i] = binary.BigEndian.Uint64(raw[8*i:])
		}
		q.mu.Lock()
		if len(q.l2s) > 512 { // 512 tables of 64 KiB clusters map 256 GiB
			clear(q.l2s)
		}
		q.l2s[l2off] = tab
		q.mu.Unlock()
	}
	return tab[idx&(1<<l2Bits-1)], nil
}

// Chain is a qcow2 file and its backing files, read as the guest's disk.
type Chain struct {
	files []*qcowFile // top first
	size  int64
}

// OpenChain opens top and the files under it.
func OpenChain(top string) (*Chain, error) {
	c := &Chain{}
	for p := top; p != ""; {
		if len(c.files) == maxChainLength {
			c.Close()
			return nil, fmt.Errorf("%s: a backing chain longer than %d", top, maxChainLength)
		}
		q, err := openQcow(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, q)
		p = q.backing
	}
	c.size = int64(c.files[0].size)
	return c, nil
}

// Close closes the chain's files.
func (c *Chain) Close() {
	for _, q := range c.files {
		q.f.Close()
	}
}

// Files are the chain's paths, top first.
func (c *Chain) Files() []string {
	out := make([]string, len(c.files))
	for i, q := range c.files {
		out[i] = q.path
	}
	return out
}

// Size is the guest disk's size.
func (c *Chain) Size() int64 { return c.size }

// ReadAt reads the guest's disk.
func (c *Chain) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	n := 0
	for n < len(p) {
		o := off + int64(n)
		if o >= c.size {
			return n, io.EOF
		}
		cs := c.files[0].clusterSize()
		chunk := min(int64(len(p)-n), cs-o%cs, c.size-o)
		if err := c.readCluster(p[n:n+int(chunk)], o); err != nil {
			return n, err
		}
		n += int(chunk)
	}
	return n, nil
}

// readCluster fills p (within one cluster of every file: the chain's
// files share a cluster size or are read per their own) from the first
// file that has the data.
func (c *Chain) readCluster(p []byte, off int64) error {
	for _, q := range c.files {
		cs := q.clusterSize()
		if off/cs != (off+int64(len(p))-1)/cs {
			// A lower file with smaller clusters: split.
			first := cs - off%cs
			if err := c.readCluster(p[:first], off); err != nil {
				return err
			}
			return c.readCluster(p[first:], off+first)
		}
		e, err := q.l2Entry(uint64(off))
		if err != nil {
			return err
		}
		switch {
		case e&l2Compressed != 0:
			return q.readCompressed(p, e, off)
		case e&l2Zero != 0:
			clear(p)
			return nil
		case e&l2OffsetMask != 0:
			_, err := q.f.ReadAt(p, int64(e&l2OffsetMask)+off%cs)
			if err == io.EOF {
				err = nil // a cluster at the file's end not written whole
			}
			return err
		}
	}
	clear(p) // no file has it
	return nil
}

func (q *qcowFile) readCompressed(p []byte, e uint64, off int64) error {
	x := 62 - (q.clusterBits - 8)
	host := int64(e & (1<<x - 1))
	sectors := int64((e>>x)&(1<<(62-x)-1)) + 1
	raw := make([]byte, sectors*512)
	n, err := q.f.ReadAt(raw, host)
	if err != nil && err != io.EOF {
		return err
	}
	out := make([]byte, q.clusterSize())
	if _, err := io.ReadFull(flate.NewReader(bytes.NewReader(raw[:n])), out); err != nil && err != io.ErrUnexpectedEOF {
		return fmt.Errorf("%s: compressed cluster: %w", q.path, err)
	}
	copy(p, out[off%q.clusterSize():])
	return nil
}

// WrittenAbove reports whether any of the chain's files above the one at
// index base (top first) holds the cluster of the guest offset off: the
// bytes there may differ from what the chain at base reads. base at or
// past the end means every file counts.
func (c *Chain) WrittenAbove(base int, off int64) (bool, error) {
	for i := 0; i < base && i < len(c.files); i++ {
		e, err := c.files[i].l2Entry(uint64(off))
		if err != nil {
			return false, err
		}
		if e != 0 {
			return true, nil
		}
	}
	return false, nil
}

// Index is the position of the file at path in the chain (top first),
// or -1.
func (c *Chain) Index(path string) int {
	want, err := os.Stat(path)
	for i, q := range c.files {
		if q.path == filepath.Clean(path) {
			return i
		}
		if err == nil {
			if fi, err := q.f.Stat(); err == nil && os.SameFile(fi, want) {
				return i
			}
		}
	}
	return -1
}

// Below is a view of the chain from index i down (the disk as it was when
// the file at i was the top).
func (c *Chain) Below(i int) *Chain {
	return &Chain{files: c.files[i:], size: int64(c.files[i].size)}
}
