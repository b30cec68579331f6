package builder

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// Limits of a build context (a tar the client sends).
const (
	maxContextBytes   = 4 << 30
	maxContextEntries = 200_000
)

// buildContext is a build's files, unpacked in a directory of the daemon's.
// Nothing in it is followed: symlinks are kept as symlinks and no entry is
// written through one.
type buildContext struct {
	dir   string
	root  *os.Root
	kinds map[string]fs.FileMode // relative path → type (0 for a file)
	modes map[string]fs.FileMode // the modes sent (the daemon's copy is its own, 0600 or 0700)
	paths []string               // every entry, sorted
}

// unpackContext reads a tar stream into dir (which must not exist). Every
// write goes through an os.Root of dir, which refuses a path that leaves
// it, symlinks included; an entry under a symlink is refused outright.
func unpackContext(r io.Reader, dir string) (*buildContext, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	c := &buildContext{dir: dir, root: root, kinds: map[string]fs.FileMode{}, modes: map[string]fs.FileMode{}}
	if err := c.unpack(r); err != nil {
		root.Close()
		return nil, err
	}
	for p := range c.kinds {
		c.paths = append(c.paths, p)
	}
	sort.Strings(c.paths)
	return c, nil
}

func (c *buildContext) close() { c.root.Close() }

func (c *buildContext) unpack(r io.Reader) error {
	tr := tar.NewReader(r)
	var total int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: build context: not a tar stream: %v", ErrInvalid, err)
		}
		if strings.ContainsRune(hdr.Name, 0) || strings.HasPrefix(hdr.Name, "/") {
			return fmt.Errorf("%w: build context: entry %q: paths are relative and stay inside the context", ErrInvalid, hdr.Name)
		}
		name := path.Clean(hdr.Name)
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("%w: build context: entry %q: paths are relative and stay inside the context", ErrInvalid, hdr.Name)
		}
		if name == "." {
			continue
		}
		if len(c.kinds) >= maxContextEntries {
			return fmt.Errorf("%w: build context: more than %d entries", ErrInvalid, maxContextEntries)
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if k, ok := c.kinds[d]; ok && k != fs.ModeDir {
				return fmt.Errorf("%w: build context: entry %q is under %s, which is not a directory", ErrInvalid, hdr.Name, d)
			}
		}
		if k, dup := c.kinds[name]; dup && (hdr.Typeflag != tar.TypeDir || k != fs.ModeDir) {
			return fmt.Errorf("%w: build context: entry %q appears twice", ErrInvalid, hdr.Name)
		}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := c.kinds[d]; !ok {
				c.kinds[d] = fs.ModeDir
			}
		}
		if d := path.Dir(name); d != "." {
			if err := c.root.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("%w: build context: %s: %v", ErrInvalid, hdr.Name, err)
			}
		}
		mode := os.FileMode(hdr.Mode) & 0o7777
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := c.root.MkdirAll(name, 0o700); err != nil {
				return fmt.Errorf("%w: build context: %s: %v", ErrInvalid, hdr.Name, err)
			}
			c.kinds[name] = fs.ModeDir
		case tar.TypeReg:
			total += hdr.Size
			if total > maxContextBytes {
				return fmt.Errorf("%w: build context: over %d GiB", ErrInvalid, maxContextBytes>>30)
			}
			f, err := c.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("%w: build context: %s: %v", ErrInvalid, hdr.Name, err)
			}
			_, err = io.Copy(f, io.LimitReader(tr, hdr.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("build context: %s: %w", name, err)
			}
			c.kinds[name] = 0
		case tar.TypeSymlink:
			if err := c.root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("%w: build context: %s: %v", ErrInvalid, hdr.Name, err)
			}
			c.kinds[name] = fs.ModeSymlink
		default:
			continue // devices, FIFOs, hard links: not part of a context
		}
		c.modes[name] = mode
	}
}

func (c *buildContext) mode(rel string) os.FileMode {
	if m, ok := c.modes[rel]; ok {
		return m
	}
	return 0o755 // a directory only implied by its entries
}

// copySet is what a COPY or ADD writes: files of the context and where.
type copySet struct {
	destDir string     // the directory the entries are written under
	items   []copyItem // relative to destDir
	owner   string     // --chown (default root)
	mode    uint32     // --chmod (0: as sent)
	sources []string   // as written, for messages
}

type copyItem struct {
	src  string // relative path in the context
	name string // relative to destDir
	kind fs.FileMode
}

// choose resolves a COPY's sources (globs allowed) against the context.
func (c *buildContext) choose(srcs []string, dest string, add bool) (*copySet, error) {
	cs := &copySet{sources: srcs}
	var matched []string
	for _, s := range srcs {
		if add && (strings.Contains(s, "://") || strings.HasPrefix(s, "git@")) {
			return nil, fmt.Errorf("%s: remote sources are not supported (COPY files from the build context, or RUN curl)", s)
		}
		rel := strings.TrimPrefix(path.Clean("/"+s), "/")
		var found []string
		if strings.ContainsAny(rel, "*?[") {
			for _, p := range c.paths {
				if ok, err := path.Match(rel, p); err != nil {
					return nil, fmt.Errorf("%s: bad pattern: %v", s, err)
				} else if ok {
					found = append(found, p)
				}
			}
		} else if _, ok := c.kinds[rel]; ok || rel == "" {
			found = []string{rel}
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: no such file or directory in the build context", s)
		}
		matched = append(matched, found...)
	}
	intoDir := strings.HasSuffix(dest, "/") || len(matched) > 1
	for _, m := range matched {
		if m == "" || c.kinds[m] == fs.ModeDir {
			intoDir = true
		}
	}
	if intoDir {
		cs.destDir = strings.TrimSuffix(dest, "/")
		if cs.destDir == "" {
			cs.destDir = "/"
		}
	} else {
		cs.destDir = path.Dir(dest)
	}
	seen := map[string]bool{}
	add1 := func(src, name string, kind fs.FileMode) error {
		if seen[name] {
			return nil
		}
		if add && kind == 0 && isArchiveName(src) {
			return fmt.Errorf("%s: ADD of a local archive (extracting it) is not supported; COPY it and RUN tar -x", src)
		}
		seen[name] = true
		cs.items = append(cs.items, copyItem{src: src, name: name, kind: kind})
		return nil
	}
	for _, m := range matched {
		kind := c.kinds[m]
		if m == "" || kind == fs.ModeDir {
			for _, p := range c.paths {
				if m != "" && !strings.HasPrefix(p, m+"/") {
					continue
				}
				inner := strings.TrimPrefix(strings.TrimPrefix(p, m), "/")
				if err := add1(p, inner, c.kinds[p]); err != nil {
					return nil, err
				}
			}
			continue
		}
		name := path.Base(m)
		if !intoDir {
			name = path.Base(dest)
		}
		if err := add1(m, name, kind); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

func isArchiveName(p string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	return false
}

// digest hashes what the copy writes: names, kinds, modes, owner and the
// files' contents (not their times).
func (cs *copySet) digest(c *buildContext) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "dest %q owner %q mode %o\n", cs.destDir, cs.owner, cs.mode)
	for _, it := range cs.items {
		fmt.Fprintf(h, "%q %v %o ", it.name, it.kind, c.mode(it.src))
		switch it.kind {
		case fs.ModeSymlink:
			l, err := c.root.Readlink(it.src)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "-> %q\n", l)
		case 0:
			f, err := c.root.Open(it.src)
			if err != nil {
				return "", err
			}
			fh := sha256.New()
			_, err = io.Copy(fh, f)
			f.Close()
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%x\n", fh.Sum(nil))
		default:
			fmt.Fprintln(h)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeTar writes the copy as a tar whose names are relative to destDir,
// owned by the --chown owner (root by default, as Docker does).
func (cs *copySet) writeTar(w io.Writer, c *buildContext) error {
	tw := tar.NewWriter(w)
	uname, gname, _ := strings.Cut(cs.owner, ":")
	if uname == "" {
		uname = "root"
	}
	if gname == "" {
		gname = uname
	}
	for _, it := range cs.items {
		mode := int64(c.mode(it.src))
		if cs.mode != 0 {
			mode = int64(cs.mode)
		}
		hdr := &tar.Header{Name: it.name, Mode: mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		setOwner(hdr, uname, gname)
		var f *os.File
		switch it.kind {
		case fs.ModeDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, it.name+"/"
		case fs.ModeSymlink:
			l, err := c.root.Readlink(it.src)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, l
		default:
			var err error
			if f, err = c.root.Open(it.src); err != nil {
				return err
			}
			st, err := f.Stat()
			if err != nil {
				f.Close()
				return err
			}
			hdr.Typeflag, hdr.Size, hdr.ModTime = tar.TypeReg, st.Size(), st.ModTime()
		}
		if err := tw.WriteHeader(hdr); err != nil {
			if f != nil {
				f.Close()
			}
			return err
		}
		if f != nil {
			_, err := io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// setOwner names the owner in a tar header: numeric ids as ids, names as
// names (the guest resolves them).
func setOwner(hdr *tar.Header, uname, gname string) {
	var id int
	if _, err := fmt.Sscanf(uname, "%d", &id); err == nil && fmt.Sprint(id) == uname {
		hdr.Uid = id
	} else {
		hdr.Uname = uname
	}
	if _, err := fmt.Sscanf(gname, "%d", &id); err == nil && fmt.Sprint(id) == gname {
		hdr.Gid = id
	} else {
		hdr.Gname = gname
	}
}
