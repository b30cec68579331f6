package fsdiff

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// An ext4 file system read through an io.ReaderAt (the guest's disk), read
// only: the superblock, group descriptors, inodes, extent trees (and the
// old block maps), directories and symlinks. Everything it reads is the
// guest's to forge: sizes, counts and depths are bounded, and a structure
// that does not add up is an error, never a panic or a loop.

var le = binary.LittleEndian

const (
	ext4Magic        = 0xEF53
	featIncomp64bit  = 0x80
	featIncompExtent = 0x40
	flagExtents      = 0x80000
	flagInlineData   = 0x10000000
	extentMagic      = 0xF30A
	maxExtentDepth   = 5
	maxExtents       = 1 << 20 // per file
	maxGDT           = 64 << 20
	rootInode        = 2
	// maxTableCache bounds the inode table blocks kept, in bytes.
	maxTableCache = 64 << 20
	// maxReadBytes and maxNodes bound one file system's reads in one diff:
	// a forged one cannot make it read or walk without end.
	maxReadBytes = 16 << 30
	maxNodes     = 4 << 20

	sIFMT  = 0xF000
	sIFDIR = 0x4000
	sIFREG = 0x8000
	sIFLNK = 0xA000
)

// ErrCorrupt is a file system whose structures do not add up.
var ErrCorrupt = errors.New("the file system's structures do not add up")

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// FS is an ext4 file system.
type FS struct {
	r              io.ReaderAt
	size           int64
	blockSize      int64
	inodesPerGroup uint32
	inodeSize      uint32
	inodesCount    uint32
	groups         []uint64 // each group's inode table block

	mu     sync.Mutex
	tables map[int64][]byte // inode table blocks read, by block (a cache)
	read   int64            // bytes read, against maxReadBytes
	nodes  int64            // extent and indirect nodes walked, against maxNodes
}

// spend accounts n bytes read, failing past the budget.
func (fs *FS) spend(n int64) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.read += n
	if fs.read > maxReadBytes {
		return corrupt("more than %d GiB read from one file system", maxReadBytes>>30)
	}
	return nil
}

// node accounts one tree node walked, failing past the budget.
func (fs *FS) node() error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.nodes++
	if fs.nodes > maxNodes {
		return corrupt("more than %d extent or indirect nodes", maxNodes)
	}
	return nil
}

// OpenFS reads the superblock and group descriptors of the file system on
// r (of size bytes).
func OpenFS(r io.ReaderAt, size int64) (*FS, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, 1024); err != nil {
		return nil, fmt.Errorf("ext4 superblock: %w", err)
	}
	if le.Uint16(sb[56:]) != ext4Magic {
		return nil, errors.New("the disk holds no ext2/3/4 file system at its start")
	}
	logBS := le.Uint32(sb[24:])
	if logBS > 6 {
		return nil, corrupt("block size 1024<<%d", logBS)
	}
	fs := &FS{r: r, size: size, blockSize: 1024 << logBS, inodesPerGroup: le.Uint32(sb[40:]),
		inodesCount: le.Uint32(sb[0:]), inodeSize: 128, tables: map[int64][]byte{}}
	if le.Uint32(sb[76:]) >= 1 {
		fs.inodeSize = uint32(le.Uint16(sb[88:]))
	}
	if fs.inodeSize < 128 || fs.inodeSize > uint32(fs.blockSize) || fs.inodeSize&(fs.inodeSize-1) != 0 {
		return nil, corrupt("inode size %d", fs.inodeSize)
	}
	if fs.inodesPerGroup == 0 || fs.inodesPerGroup > 1<<24 {
		return nil, corrupt("%d inodes per group", fs.inodesPerGroup)
	}
	incompat := le.Uint32(sb[96:])
	descSize := int64(32)
	if incompat&featIncomp64bit != 0 {
		descSize = int64(le.Uint16(sb[254:]))
		if descSize < 32 || descSize > 1024 {
			return nil, corrupt("group descriptor size %d", descSize)
		}
	}
	ngroups := (uint64(fs.inodesCount) + uint64(fs.inodesPerGroup) - 1) / uint64(fs.inodesPerGroup)
	if ngroups == 0 || ngroups > 1<<20 {
		return nil, corrupt("%d block groups", ngroups)
	}
	firstData := int64(le.Uint32(sb[20:]))
	if gdtSize := int64(ngroups) * descSize; gdtSize > min(size, maxGDT) || (firstData+1)*fs.blockSize+gdtSize > size {
		return nil, corrupt("%d group descriptors of %d bytes on a disk of %d", ngroups, descSize, size)
	}
	gdt := make([]byte, int64(ngroups)*descSize)
	if _, err := r.ReadAt(gdt, (firstData+1)*fs.blockSize); err != nil {
		return nil, fmt.Errorf("ext4 group descriptors: %w", err)
	}
	fs.groups = make([]uint64, ngroups)
	for g := range fs.groups {
		d := gdt[int64(g)*descSize:]
		t := uint64(le.Uint32(d[8:]))
		if descSize >= 64 {
			t |= uint64(le.Uint32(d[0x28:])) << 32
		}
		fs.groups[g] = t
	}
	return fs, nil
}

// Inode is what the diff needs of an inode.
type Inode struct {
	Num      uint32
	Mode     uint16
	UID, GID uint32
	Size     int64
	Mtime    int64 // seconds
	MtimeNs  uint32
	flags    uint32
	block    [60]byte // i_block: extents, block map, or a short symlink
	blocks   uint64   // i_blocks
	// Off is the inode's byte offset on the disk (WrittenAbove of it
	// tells whether it may have changed).
	Off int64
}

// IsDir, IsReg and IsLink say what the inode is.
func (i *Inode) IsDir() bool  { return i.Mode&sIFMT == sIFDIR }
func (i *Inode) IsReg() bool  { return i.Mode&sIFMT == sIFREG }
func (i *Inode) IsLink() bool { return i.Mode&sIFMT == sIFLNK }

// Inode reads inode n.
func (fs *FS) Inode(n uint32) (*Inode, error) {
	if n == 0 || n > fs.inodesCount {
		return nil, corrupt("inode %d out of range", n)
	}
	g := (n - 1) / fs.inodesPerGroup
	idx := int64((n - 1) % fs.inodesPerGroup)
	if int(g) >= len(fs.groups) {
		return nil, corrupt("inode %d in group %d of %d", n, g, len(fs.groups))
	}
	if fs.groups[g] >= uint64(fs.size/fs.blockSize) {
		return nil, corrupt("inode %d's table past the disk", n)
	}
	off := int64(fs.groups[g])*fs.blockSize + idx*int64(fs.inodeSize)
	blk := off / fs.blockSize * fs.blockSize
	if off < 0 || blk < 0 || blk+fs.blockSize > fs.size {
		return nil, corrupt("inode %d's table past the disk", n)
	}
	fs.mu.Lock()
	b, ok := fs.tables[blk]
	fs.mu.Unlock()
	if !ok {
		b = make([]byte, fs.blockSize)
		if err := fs.readAt(b, blk); err != nil {
			return nil, err
		}
		fs.mu.Lock()
		if int64(len(fs.tables))*fs.blockSize > maxTableCache {
			clear(fs.tables)
		}
		fs.tables[blk] = b
		fs.mu.Unlock()
	}
	raw := b[off-blk : off-blk+int64(fs.inodeSize)]
	in := &Inode{Num: n, Mode: le.Uint16(raw[0:]), UID: uint32(le.Uint16(raw[2:])) | uint32(le.Uint16(raw[0x78:]))<<16,
		GID: uint32(le.Uint16(raw[0x18:])) | uint32(le.Uint16(raw[0x7A:]))<<16, Size: int64(uint64(le.Uint32(raw[4:])) | uint64(le.Uint32(raw[0x6C:]))<<32),
		Mtime: int64(int32(le.Uint32(raw[0x10:]))), flags: le.Uint32(raw[0x20:]), blocks: uint64(le.Uint32(raw[0x1C:])), Off: off}
	copy(in.block[:], raw[0x28:0x28+60])
	if fs.inodeSize > 128 {
		extra := uint32(le.Uint16(raw[0x80:]))
		if extra >= 8 && 0x80+extra <= fs.inodeSize { // i_mtime_extra at 0x88
			x := le.Uint32(raw[0x88:])
			in.Mtime += int64(x&3) << 32
			in.MtimeNs = x >> 2
		}
	}
	if in.Size < 0 {
		return nil, corrupt("inode %d has a negative size", n)
	}
	return in, nil
}

// Extent is a run of a file's blocks: logical block, disk block, length.
type Extent struct {
	Logical   uint32
	Physical  uint64
	Len       uint32
	Unwritten bool // reads as zeros
}

// Extents lists the inode's blocks in logical order.
func (fs *FS) Extents(in *Inode) ([]Extent, error) {
	if in.flags&flagInlineData != 0 {
		return nil, fmt.Errorf("inode %d: inline data is not read", in.Num)
	}
	if in.IsLink() && in.Size < 60 && in.flags&flagExtents == 0 {
		return nil, nil // a fast symlink: its target is in i_block
	}
	var out []Extent
	if in.flags&flagExtents != 0 {
		if err := fs.extentNode(in.block[:], -1, &out); err != nil {
			return nil, fmt.Errorf("inode %d: %w", in.Num, err)
		}
		return out, nil
	}
	if err := fs.blockMap(in, &out); err != nil {
		return nil, fmt.Errorf("inode %d: %w", in.Num, err)
	}
	return out, nil
}

// extentNode reads an extent tree node whose depth must be want (-1 for
// the root, which says its own).
func (fs *FS) extentNode(b []byte, want int, out *[]Extent) error {
	if len(b) < 12 || le.Uint16(b[0:]) != extentMagic {
		return corrupt("bad extent header")
	}
	n, d := int(le.Uint16(b[2:])), int(le.Uint16(b[6:]))
	if d > maxExtentDepth || (want >= 0 && d != want) || 12+12*n > len(b) {
		return corrupt("extent node of depth %d with %d entries", d, n)
	}
	if err := fs.node(); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		e := b[12+12*i:]
		if d == 0 {
			l := uint32(le.Uint16(e[4:]))
			unwritten := l > 32768
			if unwritten {
				l -= 32768
			}
			phys := uint64(le.Uint16(e[6:]))<<32 | uint64(le.Uint32(e[8:]))
			if len(*out) >= maxExtents {
				return corrupt("more than %d extents", maxExtents)
			}
			*out = append(*out, Extent{Logical: le.Uint32(e[0:]), Physical: phys, Len: l, Unwritten: unwritten})
			continue
		}
		child := uint64(le.Uint16(e[8:]))<<32 | uint64(le.Uint32(e[4:]))
		nb := make([]byte, fs.blockSize)
		if err := fs.readBlock(nb, child); err != nil {
			return err
		}
		if err := fs.extentNode(nb, d-1, out); err != nil {
			return err
		}
	}
	return nil
}

// blockMap lists the blocks of an inode with ext2/3 block maps (direct,
// indirect, double and triple indirect).
func (fs *FS) blockMap(in *Inode, out *[]Extent) error {
	nblocks := (in.Size + fs.blockSize - 1) / fs.blockSize
	per := fs.blockSize / 4
	var logical uint32
	add := func(p uint32) error {
		if int64(logical) >= nblocks {
			return io.EOF
		}
		if len(*out) >= maxExtents {
			return corrupt("more than %d blocks", maxExtents)
		}
		if p != 0 {
			if k := len(*out); k > 0 && (*out)[k-1].Logical+(*out)[k-1].Len == logical && (*out)[k-1].Physical+uint64((*out)[k-1].Len) == uint64(p) {
				(*out)[k-1].Len++
			} else {
				*out = append(*out, Extent{Logical: logical, Physical: uint64(p), Len: 1})
			}
		}
		logical++
		return nil
	}
	var walk func(blk uint32, level int) error
	walk = func(blk uint32, level int) error {
		if blk == 0 {
			skip := int64(1)
			for i := 0; i < level; i++ {
				skip *= per
			}
			logical += uint32(min(skip, nblocks))
			return nil
		}
		if err := fs.node(); err != nil {
			return err
		}
		b := make([]byte, fs.blockSize)
		if err := fs.readBlock(b, uint64(blk)); err != nil {
			return err
		}
		for i := int64(0); i < per; i++ {
			p := le.Uint32(b[4*i:])
			var err error
			if level == 1 {
				err = add(p)
			} else {
				err = walk(p, level-1)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	for i := 0; i < 12; i++ {
		if err := add(le.Uint32(in.block[4*i:])); err != nil {
			return nilIfEOF(err)
		}
	}
	for lvl := 1; lvl <= 3; lvl++ {
		if err := walk(le.Uint32(in.block[48+4*(lvl-1):]), lvl); err != nil {
			return nilIfEOF(err)
		}
	}
	return nil
}

func nilIfEOF(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}

func (fs *FS) readBlock(b []byte, blk uint64) error {
	if blk >= uint64(fs.size/fs.blockSize) {
		return corrupt("block %d past the disk", blk)
	}
	return fs.readAt(b, int64(blk)*fs.blockSize)
}

// ReadFile reads up to max bytes of a file (or a symlink's target).
func (fs *FS) ReadFile(in *Inode, max int64) ([]byte, error) {
	n := min(in.Size, max)
	if in.IsLink() && in.Size < 60 && in.flags&(flagExtents|flagInlineData) == 0 {
		return append([]byte(nil), in.block[:n]...), nil
	}
	exts, err := fs.Extents(in)
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	for _, e := range exts {
		start := int64(e.Logical) * fs.blockSize
		if start >= n || e.Unwritten {
			continue
		}
		if e.Physical >= uint64(fs.size/fs.blockSize) {
			return nil, corrupt("inode %d: an extent past the disk", in.Num)
		}
		l := min(int64(e.Len)*fs.blockSize, n-start)
		if err := fs.readAt(out[start:start+l], int64(e.Physical)*fs.blockSize); err != nil {
			return nil, fmt.Errorf("inode %d: %w", in.Num, err)
		}
	}
	return out, nil
}

func (fs *FS) readAt(b []byte, off int64) error {
	if off < 0 || off+int64(len(b)) > fs.size || off+int64(len(b)) < off {
		return corrupt("data past the disk")
	}
	if err := fs.spend(int64(len(b))); err != nil {
		return err
	}
	_, err := fs.r.ReadAt(b, off)
	return err
}

// Dirent is a directory entry.
type Dirent struct {
	Name  string
	Inode uint32
}

// maxDirBytes bounds a directory's size (a forged one could claim terabytes).
const maxDirBytes = 32 << 20

// ReadDir lists a directory (without . and ..).
func (fs *FS) ReadDir(in *Inode) ([]Dirent, error) {
	if !in.IsDir() {
		return nil, fmt.Errorf("inode %d is not a directory", in.Num)
	}
	if in.Size > maxDirBytes {
		return nil, corrupt("directory inode %d of %d bytes", in.Num, in.Size)
	}
	b, err := fs.ReadFile(in, in.Size)
	if err != nil {
		return nil, err
	}
	var out []Dirent
	for blk := int64(0); blk < int64(len(b)); blk += fs.blockSize {
		end := min(blk+fs.blockSize, int64(len(b)))
		for p := blk; p+8 <= end; {
			ino := le.Uint32(b[p:])
			recLen := int64(le.Uint16(b[p+4:]))
			nameLen := int64(b[p+6])
			if recLen < 8 || p+recLen > end {
				break // the rest of this block is not entries (or is forged)
			}
			if ino != 0 && 8+nameLen <= recLen {
				name := string(b[p+8 : p+8+nameLen])
				if strings.ContainsAny(name, "/\x00") {
					return nil, corrupt("directory inode %d holds a name with / or NUL", in.Num)
				}
				if name != "." && name != ".." && name != "" {
					out = append(out, Dirent{Name: name, Inode: ino})
				}
			}
			p += recLen
		}
	}
	return out, nil
}
