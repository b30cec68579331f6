package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Images made from OCI images. A template build (package builder) pulls an
// image, adds systemd to its tree in a build VM where it is missing, and
// hands the tree to FromTree, which adds what every guest image has (the
// kernel's modules, the guest agent and its unit, the boot files) and packs
// it as CacheDir/images/oci-<key>/, next to the built images. The kernel and
// initrd are the default image's.

// ociRecipeVersion is bumped when what FromTree adds changes.
const ociRecipeVersion = "agentvm-oci-image-v1"

var ociNameRe = regexp.MustCompile(`^oci-[0-9a-f]{16}$`)

// IsOCIName reports whether name is an image made from an OCI image.
func IsOCIName(name string) bool { return ociNameRe.MatchString(name) }

// OCIName is the image an OCI image (by its manifest digest) becomes when
// prepared by the script prep, on top of def, the default image (whose
// hash covers the recipe and the agent): a new agent or a new preparation
// makes a new image.
func OCIName(digest, prep string, def *Image) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%d\n%s\n", ociRecipeVersion, digest, def.Hash, len(prep), prep)
	writeImageStage(h)
	return "oci-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// DiskSize is the size of an image's root filesystem: an OCI image's files
// must fit it.
const DiskSize = diskSize

// LockCache takes the image cache's lock (an flock: across the daemons of
// the host), for what changes an image made from an OCI image.
func LockCache(ctx context.Context, cacheDir string) (unlock func(), err error) {
	return lockCache(ctx, filepath.Join(cacheDir, "lock"), func(string) {})
}

// ErrNotBuilt: an image made from an OCI image is not in this host's cache
// (its template was built on another host, or the cache was cleared).
var ErrNotBuilt = errors.New("not in this host's image cache")

// ensureOCI returns a cached image made from an OCI image.
func ensureOCI(o Options) (*Image, error) {
	img := newImage(o.CacheDir, o.Name)
	img.Name, img.Warm = o.Name, warmCommand
	ok, err := img.complete()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("image %s (made from an OCI image by a template build): %w; build the template again", o.Name, ErrNotBuilt)
	}
	return img, nil
}

// FromTree packs tree, an OCI image's root filesystem prepared by a build
// VM, as the image name (OCIName). The tree's contents are not trusted:
// every write into it goes through an os.Root, so no symlink in it leads
// out. tree is removed once packed (the caller removes it on an error).
func FromTree(ctx context.Context, o Options, name, tree string) (*Image, error) {
	if !IsOCIName(name) {
		return nil, fmt.Errorf("image: %q is not an OCI image's name", name)
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	def, err := Ensure(ctx, Options{CacheDir: o.CacheDir, AgentPath: o.AgentPath, Progress: o.Progress})
	if err != nil {
		return nil, err
	}
	img := newImage(o.CacheDir, name)
	img.Name, img.Warm = name, warmCommand
	unlock, err := lockCache(ctx, filepath.Join(o.CacheDir, "lock"), o.Progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if ok, err := img.complete(); ok || err != nil {
		return img, err
	}
	for _, t := range []string{"mkfs.ext4", "qemu-img"} {
		if _, err := lookPath(t); err != nil {
			return nil, fmt.Errorf("image: missing %s; %s", t, errMissingTools)
		}
	}
	modules := filepath.Join(o.CacheDir, "rootfs", RecipeHash(), "root", "usr", "lib", "modules")
	if err := addGuestFiles(tree, o.AgentPath, modules); err != nil {
		return nil, err
	}

	imagesDir := filepath.Join(o.CacheDir, "images")
	b := &builder{progress: o.Progress, imagesDir: imagesDir, rootfsBase: filepath.Join(o.CacheDir, "rootfs")}
	b.removeStaleTemps() // a daemon killed while packing left one
	if err := os.MkdirAll(imagesDir, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	tmp, err := os.MkdirTemp(imagesDir, ".tmp-"+name+"-")
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	defer removeTree(tmp) // empty after a publish
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if err := b.packDisk(ctx, tree, tmp, def.Kernel, def.Initrd); err != nil {
		return nil, err
	}
	manifest, _ := json.MarshalIndent(map[string]any{
		"hash": name, "image": name, "base_image": def.Hash, "recipe": ociRecipeVersion,
		"size_bytes": diskSize, "created": time.Now().UTC().Format(time.RFC3339),
	}, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), append(manifest, '\n'), 0o444); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if err := publish(tmp, img.Dir); err != nil {
		return nil, err
	}
	if ok, err := img.complete(); !ok {
		if err == nil {
			err = errors.New("image: packed, but the image is incomplete")
		}
		return nil, err
	}
	return img, nil
}

// ociFiles are the recipe's files an OCI image's tree gets (its own apt
// sources, users and sudoers stay as they are).
var ociFiles = []string{"/etc/hostname", "/etc/hosts", "/etc/fstab", "/etc/resolv.conf", "/etc/sysctl.d/10-agentvm.conf"}

// addGuestFiles writes what every guest image has into tree: the boot
// files, the masked units, the agent and its unit, and the kernel's
// modules (copied from modules, the default rootfs stage's).
func addGuestFiles(tree, agentPath, modules string) error {
	root, err := os.OpenRoot(tree)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer root.Close()
	if !hasInit(root) {
		return errors.New("image: the image has no /sbin/init after its preparation (systemd-sysv)")
	}
	put := func(rel string, data []byte, mode fs.FileMode) error {
		rel = strings.TrimPrefix(rel, "/")
		if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("image: the image's %s: %w", filepath.Dir(rel), err)
		}
		if err := root.RemoveAll(rel); err != nil {
			return fmt.Errorf("image: the image's %s: %w", rel, err)
		}
		f, err := root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
		if err != nil {
			return fmt.Errorf("image: the image's %s: %w", rel, err)
		}
		_, err = f.Write(data)
		if err == nil {
			err = f.Chmod(mode)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("image: the image's %s: %w", rel, err)
		}
		return nil
	}
	link := func(rel, target string) error {
		rel = strings.TrimPrefix(rel, "/")
		if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("image: the image's %s: %w", filepath.Dir(rel), err)
		}
		if err := root.RemoveAll(rel); err != nil {
			return fmt.Errorf("image: the image's %s: %w", rel, err)
		}
		if err := root.Symlink(target, rel); err != nil {
			return fmt.Errorf("image: the image's %s: %w", rel, err)
		}
		return nil
	}
	for _, f := range rootfsFiles {
		for _, p := range ociFiles {
			if f.Path == p {
				if err := put(f.Path, []byte(f.Content), fs.FileMode(f.Mode)); err != nil {
					return err
				}
			}
		}
	}
	for _, u := range maskedUnits {
		if err := link("/etc/systemd/system/"+u, "/dev/null"); err != nil {
			return err
		}
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return fmt.Errorf("image: agent binary: %w", err)
	}
	if err := put(agentGuestPath, agent, 0o755); err != nil {
		return err
	}
	unitPath := "/etc/systemd/system/" + agentUnitName
	if err := put(unitPath, []byte(agentUnit), 0o644); err != nil {
		return err
	}
	if err := link("/etc/systemd/system/"+agentWantedBy+".wants/"+agentUnitName, unitPath); err != nil {
		return err
	}
	return copyTreeInto(root, modules, "lib/modules") // lib is usr/lib, a relative link, in a merged /usr
}

// hasInit reports whether the tree has an init (a link, as systemd-sysv
// makes it, or a file).
func hasInit(root *os.Root) bool {
	for _, p := range []string{"sbin/init", "usr/sbin/init"} {
		if _, err := root.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// copyTreeInto copies the trusted directory src to dst in root: directories,
// files and symlinks.
func copyTreeInto(root *os.Root, src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("image: the kernel's modules: %w", err)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fail := func(err error) error { return fmt.Errorf("image: the image's %s: %w", to, err) }
		switch {
		case d.IsDir():
			if err := root.MkdirAll(to, 0o755); err != nil {
				return fail(err)
			}
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			root.RemoveAll(to)
			if err := root.Symlink(t, to); err != nil {
				return fail(err)
			}
		case d.Type().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			root.RemoveAll(to)
			out, err := root.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return fail(err)
			}
			_, err = io.Copy(out, in)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(err)
			}
		}
		return nil
	})
}
