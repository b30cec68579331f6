package fsdiff

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"unicode/utf8"
)

// Entry is one path that differs.
type Entry struct {
	Path    string `json:"path"`
	Kind    string `json:"kind"` // file, dir, symlink, other
	Size    int64  `json:"size"`
	OldSize int64  `json:"old_size,omitempty"`
	Mode    uint32 `json:"mode,omitempty"` // permission bits and type, as stat's st_mode
	OldMode uint32 `json:"old_mode,omitempty"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	// What changed of a changed entry: content, mode, owner, target, kind.
	What   []string `json:"what,omitempty"`
	Target string   `json:"target,omitempty"` // a symlink's
	Binary bool     `json:"binary,omitempty"`
	// Diff is the unified diff of a text file (added: from /dev/null);
	// DiffNote says why there is none when there could be.
	Diff     string `json:"diff,omitempty"`
	DiffNote string `json:"diff_note,omitempty"`
}

// Result is a comparison.
type Result struct {
	Added   []Entry `json:"added"`
	Changed []Entry `json:"changed"`
	Removed []Entry `json:"removed"`
	// Truncated: more entries differ than Options.MaxEntries.
	Truncated bool `json:"truncated,omitempty"`
	// Scanned is how many entries of the newer tree were looked at.
	Scanned int `json:"scanned"`
}

// Options tune Compare.
type Options struct {
	// Ignore lists patterns of paths left out (with what is under them): an
	// absolute pattern matches from the root (/var/lib/apt/lists), a
	// relative one any run of path components (__pycache__,
	// node_modules/.cache); each component may use * ? [ ].
	Ignore []string
	// MaxEntries bounds the entries reported (0: 20000).
	MaxEntries int
	// Diffs adds unified diffs of text files up to MaxDiffFile bytes
	// (0: 256 KiB), MaxDiffTotal in all (0: 8 MiB).
	Diffs        bool
	MaxDiffFile  int64
	MaxDiffTotal int64
	// Context, when set, ends the compare early with its error.
	Context context.Context
}

const (
	maxDepth   = 256
	maxScanned = 5_000_000
)

type comparer struct {
	old, new  *FS    // the older and the newer tree
	chain     *Chain // the newer chain (fast path)
	fast      int    // the older tree's top in chain, or -1
	opts      Options
	res       *Result
	diffBytes int64
	lookups   int64 // cluster lookups, against maxLookups
}

// maxLookups bounds the cluster lookups of one compare: past it what is
// left is compared by reading (which the file systems' read budget bounds).
const maxLookups = 64 << 20

func (c *comparer) ctxErr() error {
	if c.opts.Context == nil {
		return nil
	}
	return c.opts.Context.Err()
}

// Compare tells what differs from the older file system to the newer.
// fast, when >= 0, is the position of the older tree's top file in the
// newer chain (newer.Below(fast) is the older tree): what lies in clusters
// no file above it wrote is then known equal without being read.
func Compare(older, newer *FS, chain *Chain, fast int, opts Options) (*Result, error) {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = 20000
	}
	if opts.MaxDiffFile <= 0 {
		opts.MaxDiffFile = 256 << 10
	}
	if opts.MaxDiffTotal <= 0 {
		opts.MaxDiffTotal = 8 << 20
	}
	c := &comparer{old: older, new: newer, chain: chain, fast: fast, opts: opts,
		res: &Result{Added: []Entry{}, Changed: []Entry{}, Removed: []Entry{}}}
	ro, err := older.Inode(rootInode)
	if err != nil {
		return nil, err
	}
	rn, err := newer.Inode(rootInode)
	if err != nil {
		return nil, err
	}
	if err := c.dir("/", ro, rn, 0); err != nil && err != errFull {
		return nil, err
	}
	for _, l := range [][]Entry{c.res.Added, c.res.Changed, c.res.Removed} {
		sort.Slice(l, func(i, j int) bool { return l[i].Path < l[j].Path })
	}
	return c.res, nil
}

var errFull = fmt.Errorf("enough entries")

func (c *comparer) full() bool {
	if len(c.res.Added)+len(c.res.Changed)+len(c.res.Removed) >= c.opts.MaxEntries {
		c.res.Truncated = true
		return true
	}
	return false
}

// written reports whether the newer chain wrote any cluster of
// [off, off+n) above the older tree (always true without the fast path).
func (c *comparer) written(off, n int64) (bool, error) {
	if c.fast < 0 {
		return true, nil
	}
	cs := c.chain.files[0].clusterSize()
	for o := off / cs * cs; o < off+n; o += cs {
		if c.lookups++; c.lookups > maxLookups {
			return true, nil
		}
		w, err := c.chain.WrittenAbove(c.fast, o)
		if err != nil || w {
			return true, err
		}
	}
	return false, nil
}

// sameInode reports whether inode in is byte for byte the same in both
// trees, with the same data: its slot and every block it uses unwritten.
func (c *comparer) sameInode(in *Inode) (bool, error) {
	if w, err := c.written(in.Off, 1); err != nil || w {
		return false, err
	}
	exts, err := c.new.Extents(in)
	if err != nil {
		return false, nil
	}
	bs := c.new.blockSize
	for _, e := range exts {
		if w, err := c.written(int64(e.Physical)*bs, int64(e.Len)*bs); err != nil || w {
			return false, err
		}
	}
	return true, nil
}

func (c *comparer) dir(p string, old, cur *Inode, depth int) error {
	if depth > maxDepth {
		return corrupt("directories nested deeper than %d at %s", maxDepth, p)
	}
	entries, err := c.new.ReadDir(cur)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	// The older listing is needed unless the directory is the same inode
	// with unwritten blocks (then its entries are the same).
	var olds map[string]uint32
	same := false
	if old != nil && old.Num == cur.Num {
		if same, err = c.sameInode(cur); err != nil {
			return err
		}
	}
	if !same && old != nil {
		list, err := c.old.ReadDir(old)
		if err != nil {
			return fmt.Errorf("%s (older): %w", p, err)
		}
		olds = make(map[string]uint32, len(list))
		for _, e := range list {
			olds[e.Name] = e.Inode
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	for _, e := range entries {
		cp := path.Join(p, e.Name)
		if c.ignored(cp) {
			delete(olds, e.Name)
			continue
		}
		c.res.Scanned++
		if c.res.Scanned%256 == 0 {
			if err := c.ctxErr(); err != nil {
				return err
			}
		}
		if c.res.Scanned > maxScanned {
			return corrupt("more than %d entries", maxScanned)
		}
		ni, err := c.new.Inode(e.Inode)
		if err != nil {
			return fmt.Errorf("%s: %w", cp, err)
		}
		var oi *Inode
		switch {
		case same:
			if ok, err := c.sameInode(ni); err != nil {
				return err
			} else if ok && !ni.IsDir() {
				continue // the same inode, slot and data untouched
			}
			if oi, err = c.old.Inode(e.Inode); err != nil {
				return fmt.Errorf("%s (older): %w", cp, err)
			}
		case olds != nil:
			if on, ok := olds[e.Name]; ok {
				delete(olds, e.Name)
				if oi, err = c.old.Inode(on); err != nil {
					return fmt.Errorf("%s (older): %w", cp, err)
				}
			}
		}
		if err := c.entry(cp, oi, ni, depth); err != nil {
			return err
		}
	}
	// What is left of the older listing is gone.
	names := make([]string, 0, len(olds))
	for n := range olds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cp := path.Join(p, n)
		if c.ignored(cp) {
			continue
		}
		oi, err := c.old.Inode(olds[n])
		if err != nil {
			return fmt.Errorf("%s (older): %w", cp, err)
		}
		if err := c.removed(cp, oi, depth); err != nil {
			return err
		}
	}
	return nil
}

func kind(in *Inode) string {
	switch {
	case in.IsDir():
		return "dir"
	case in.IsReg():
		return "file"
	case in.IsLink():
		return "symlink"
	}
	return "other"
}

func (c *comparer) base(p string, in *Inode, fs *FS) Entry {
	e := Entry{Path: p, Kind: kind(in), Size: in.Size, Mode: uint32(in.Mode), UID: in.UID, GID: in.GID}
	if in.IsLink() {
		t, _ := fs.ReadFile(in, 4096)
		e.Target = string(t)
	}
	if in.IsDir() {
		e.Size = 0
	}
	return e
}

func (c *comparer) entry(p string, old, cur *Inode, depth int) error {
	if c.full() {
		return errFull
	}
	if old == nil || kind(old) != kind(cur) {
		if old != nil {
			if err := c.removed(p, old, depth); err != nil {
				return err
			}
		}
		e := c.base(p, cur, c.new)
		if cur.IsReg() {
			c.textDiff(&e, nil, cur)
		}
		c.res.Added = append(c.res.Added, e)
		if cur.IsDir() {
			return c.dir(p, nil, cur, depth+1)
		}
		return nil
	}
	e := c.base(p, cur, c.new)
	var what []string
	if old.Mode != cur.Mode {
		what = append(what, "mode")
		e.OldMode = uint32(old.Mode)
	}
	if old.UID != cur.UID || old.GID != cur.GID {
		what = append(what, "owner")
	}
	switch {
	case cur.IsLink():
		if t, _ := c.old.ReadFile(old, 4096); string(t) != e.Target {
			what = append(what, "target")
		}
	case cur.IsReg():
		same, err := c.sameContent(old, cur)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if !same {
			what = append(what, "content")
			e.OldSize = old.Size
			c.textDiff(&e, old, cur)
		}
	}
	if len(what) > 0 {
		e.What = what
		c.res.Changed = append(c.res.Changed, e)
	}
	if cur.IsDir() {
		return c.dir(p, old, cur, depth+1)
	}
	return nil
}

func (c *comparer) removed(p string, old *Inode, depth int) error {
	if c.full() {
		return errFull
	}
	e := c.base(p, old, c.old)
	c.res.Removed = append(c.res.Removed, e)
	if !old.IsDir() {
		return nil
	}
	if depth > maxDepth {
		return corrupt("directories nested deeper than %d at %s", maxDepth, p)
	}
	list, err := c.old.ReadDir(old)
	if err != nil {
		return fmt.Errorf("%s (older): %w", p, err)
	}
	for _, d := range list {
		cp := path.Join(p, d.Name)
		if c.ignored(cp) {
			continue
		}
		oi, err := c.old.Inode(d.Inode)
		if err != nil {
			return fmt.Errorf("%s (older): %w", cp, err)
		}
		if err := c.removed(cp, oi, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// sameContent compares two regular files' bytes: a chunk whose blocks
// are the same on both sides and unwritten above the older tree is equal
// without being read.
func (c *comparer) sameContent(old, cur *Inode) (bool, error) {
	if old.Size != cur.Size {
		return false, nil
	}
	if c.fast < 0 && old.Mtime == cur.Mtime && old.MtimeNs == cur.MtimeNs {
		// Two trees with no layer in common: the same size and
		// modification time count as the same file (reading both whole
		// disks would be the only alternative).
		return true, nil
	}
	oe, err := c.old.Extents(old)
	if err != nil {
		return false, nil
	}
	ne, err := c.new.Extents(cur)
	if err != nil {
		return false, nil
	}
	if c.fast >= 0 && extentsEqual(oe, ne) {
		bs := c.new.blockSize
		written := false
		for _, e := range ne {
			if w, err := c.written(int64(e.Physical)*bs, int64(e.Len)*bs); err != nil {
				return false, err
			} else if w {
				written = true
				break
			}
		}
		if !written {
			return true, nil
		}
	}
	// Only what either side maps can differ: holes on both read as zeros.
	or, nr := &fileReader{c.old, old, oe}, &fileReader{c.new, cur, ne}
	const chunk = 1 << 20
	a, b := make([]byte, chunk), make([]byte, chunk)
	bs := c.new.blockSize
	for _, rg := range mappedRanges(oe, ne, bs, cur.Size) {
		for off := rg[0]; off < rg[1]; off += chunk {
			if err := c.ctxErr(); err != nil {
				return false, err
			}
			n := min(chunk, rg[1]-off)
			if err := or.read(a[:n], off); err != nil {
				return false, err
			}
			if err := nr.read(b[:n], off); err != nil {
				return false, err
			}
			if !bytes.Equal(a[:n], b[:n]) {
				return false, nil
			}
		}
	}
	return true, nil
}

// mappedRanges are the byte ranges of a file of size bytes that either
// extent list maps, merged and sorted.
func mappedRanges(a, b []Extent, bs, size int64) [][2]int64 {
	var rs [][2]int64
	for _, l := range [][]Extent{a, b} {
		for _, e := range l {
			lo := int64(e.Logical) * bs
			hi := min(lo+int64(e.Len)*bs, size)
			if lo < hi {
				rs = append(rs, [2]int64{lo, hi})
			}
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i][0] < rs[j][0] })
	var out [][2]int64
	for _, r := range rs {
		if k := len(out); k > 0 && r[0] <= out[k-1][1] {
			out[k-1][1] = max(out[k-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

func extentsEqual(a, b []Extent) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fileReader reads a file's bytes through its extents (holes and
// unwritten extents read as zeros).
type fileReader struct {
	fs   *FS
	in   *Inode
	exts []Extent
}

func (r *fileReader) read(p []byte, off int64) error {
	clear(p)
	bs := r.fs.blockSize
	for _, e := range r.exts {
		start, end := int64(e.Logical)*bs, int64(e.Logical+e.Len)*bs
		lo, hi := max(start, off), min(end, off+int64(len(p)))
		if lo >= hi || e.Unwritten {
			continue
		}
		if err := r.fs.readAt(p[lo-off:hi-off], int64(e.Physical)*bs+(lo-start)); err != nil {
			return err
		}
	}
	return nil
}

// textDiff adds the unified diff of a text file (old nil: an added one).
func (c *comparer) textDiff(e *Entry, old, cur *Inode) {
	if !c.opts.Diffs {
		return
	}
	if cur.Size > c.opts.MaxDiffFile || (old != nil && old.Size > c.opts.MaxDiffFile) {
		e.Binary = true // unknown; sizes only
		e.DiffNote = fmt.Sprintf("larger than %d bytes: sizes only", c.opts.MaxDiffFile)
		return
	}
	nb, err := c.new.ReadFile(cur, cur.Size)
	if err != nil {
		e.DiffNote = err.Error()
		return
	}
	var ob []byte
	if old != nil {
		if ob, err = c.old.ReadFile(old, old.Size); err != nil {
			e.DiffNote = err.Error()
			return
		}
	}
	if !isText(nb) || !isText(ob) {
		e.Binary = true
		return
	}
	if c.diffBytes > c.opts.MaxDiffTotal {
		e.DiffNote = "the diffs reached their total bound: sizes only"
		return
	}
	from := "a" + e.Path
	if old == nil {
		from = "/dev/null"
	}
	e.Diff = Unified(from, "b"+e.Path, string(ob), string(nb))
	c.diffBytes += int64(len(e.Diff))
}

func isText(b []byte) bool {
	head := b[:min(len(b), 8192)]
	return !bytes.Contains(head, []byte{0}) && utf8.Valid(b)
}

// ignored reports whether a path (or a directory above it) matches one of
// the ignore patterns.
func (c *comparer) ignored(p string) bool {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for _, pat := range c.opts.Ignore {
		abs := strings.HasPrefix(pat, "/")
		pp := strings.Split(strings.Trim(pat, "/"), "/")
		if len(pp) == 0 || pp[0] == "" {
			continue
		}
		starts := []int{0}
		if !abs {
			starts = starts[:0]
			for i := range parts {
				starts = append(starts, i)
			}
		}
		for _, s := range starts {
			if s+len(pp) > len(parts) {
				break
			}
			ok := true
			for j, q := range pp {
				if m, err := path.Match(q, parts[s+j]); err != nil || !m {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}
