package builder

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of an OCI image's tree: its entries, a name's length (Linux's
// PATH_MAX) and depth (each component of a path costs a lookup).
const (
	maxTreeEntries = 2_000_000
	maxPath        = 4096
	maxDepth       = 256
)

// extractTree writes the tar stream r, an OCI image's root filesystem as a
// build VM sends it back, into dir (which must not exist), with its owners,
// modes, times, links and file capabilities. The stream comes from a VM and
// is not trusted: every write goes through an os.Root of dir, so a path or
// link that would leave it is refused (links inside it are followed, as
// the guest would); an entry is never written twice, and the bytes written
// (names and a block per entry counted) stop at limit. Device nodes are
// skipped (the guest's /dev is a devtmpfs). dir's parent must be closed to
// others: the tree holds the image's set-id programs.
func extractTree(ctx context.Context, r io.Reader, dir string, limit int64) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirMeta struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirMeta
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("the image's files: %w", err)
		}
		if n >= maxTreeEntries {
			return fmt.Errorf("the image has more than %d files", maxTreeEntries)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(hdr.Name) > maxPath || len(hdr.Linkname) > maxPath || strings.Count(hdr.Name, "/") > maxDepth {
			return fmt.Errorf("the image's files: an entry's name or link is longer than %d bytes or %d directories deep", maxPath, maxDepth)
		}
		// Every entry costs its names and a block, as on the disk it goes to.
		if total += 512 + int64(len(hdr.Name)+len(hdr.Linkname)); total > limit {
			return fmt.Errorf("the image's files are larger than its disk (%d MiB)", limit>>20)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if strings.ContainsRune(hdr.Name, 0) || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("the image's files: entry %q leaves the tree", hdr.Name)
		}
		fail := func(err error) error { return fmt.Errorf("the image's /%s: %w", name, err) }
		mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.Mkdir(name, 0o700); err != nil {
					return fail(err)
				}
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fail(err)
			}
			dirs = append(dirs, dirMeta{name, mode, hdr.ModTime})
			total += int64(len(name)) // kept until the end: counted again
		case tar.TypeReg:
			if total += hdr.Size; total > limit {
				return fmt.Errorf("the image's files are larger than its disk (%d MiB)", limit>>20)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fail(err)
			}
			err = writeTreeFile(f, tr, hdr, mode)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(err)
			}
			if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
				return fail(err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fail(err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fail(err)
			}
		case tar.TypeLink:
			target := path.Clean(strings.TrimPrefix(hdr.Linkname, "./"))
			if path.IsAbs(target) || target == ".." || strings.HasPrefix(target, "../") {
				return fail(errors.New("a hard link out of the tree"))
			}
			if st, err := root.Lstat(target); err != nil || !st.Mode().IsRegular() {
				return fail(fmt.Errorf("a hard link to %s, which is not a file before it", target))
			}
			if err := root.Link(target, name); err != nil {
				return fail(err)
			}
		case tar.TypeFifo:
			// Made as a file would be, with its owner and mode (no link is followed: Mknodat of the parent).
			if err := mkfifoIn(root, name, mode); err != nil {
				return fail(err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fail(err)
			}
		case tar.TypeChar, tar.TypeBlock:
			// skipped: /dev is a devtmpfs in the guest
		default:
			return fail(fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag))
		}
	}
	// Directories last, deepest first, so their modes (read-only ones too)
	// and times hold.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return err
		}
		d := dirs[i]
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("the image's /%s: %w", d.name, err)
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("the image's /%s: %w", d.name, err)
		}
	}
	return nil
}

// writeTreeFile copies a file's bytes, then sets its owner, then its mode
// (after the owner: a chown clears set-id bits), then its capabilities; all
// on the open file, so nothing is looked up by path again.
func writeTreeFile(f *os.File, r io.Reader, hdr *tar.Header, mode fs.FileMode) error {
	if _, err := io.CopyN(f, r, hdr.Size); err != nil {
		return err
	}
	if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if c, ok := hdr.PAXRecords["SCHILY.xattr.security.capability"]; ok {
		if err := unix.Fsetxattr(int(f.Fd()), "security.capability", []byte(c), 0); err != nil {
			return fmt.Errorf("its capabilities: %w", err)
		}
	}
	return nil
}

// mkfifoIn makes a named pipe name in root: its parent is opened through
// root, the pipe is made in it.
func mkfifoIn(root *os.Root, name string, mode fs.FileMode) error {
	parent, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer parent.Close()
	if err := unix.Mkfifoat(int(parent.Fd()), path.Base(name), uint32(mode.Perm())); err != nil {
		return err
	}
	return nil
}
