// Package image builds and caches the default Debian guest image.
//
// The build has two cached stages so that a new guest agent does not redo
// debootstrap:
//
//  1. rootfs: CacheDir/rootfs/<RecipeHash>/{root/,vmlinuz,initrd.img}, a
//     configured Debian bookworm tree made by debootstrap + chroot.
//  2. image: CacheDir/images/<Hash>/{vmlinuz,initrd.img,rootfs.qcow2}, the
//     rootfs plus the agent, packed into a sparse ext4 filesystem (no
//     partition table, root=/dev/vda) converted to qcow2. Files are 0444.
//
// Both stages are built in temporary directories and published by rename,
// under an flock on CacheDir/lock so two processes never build at once.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Progress receives human-readable build step lines.
type Progress func(step string)

// Options configure Ensure.
type Options struct {
	CacheDir  string // default DefaultCacheDir()
	AgentPath string // static guest agent binary (agentvm-guest) to install
	Name      string // image name or alias (Names, Resolve); "" is the default
	Force     bool   // rebuild both stages even if cached
	Progress  Progress
}

// Image is a built, cached guest image. Its files are read-only.
type Image struct {
	Name      string // canonical image name (Default, CodeInterpreter)
	Hash      string // cache key: recipe hash + sha256 of the agent binary
	Dir       string // CacheDir/images/<Hash>
	Kernel    string // Dir/vmlinuz
	Initrd    string // Dir/initrd.img
	Disk      string // Dir/rootfs.qcow2 (ext4 on the whole device, root=/dev/vda)
	SizeBytes int64  // virtual size of Disk
	// Ready is a command the guest runs until it succeeds before a template of
	// this image is saved (nil: the agent answering is enough).
	Ready []string
	// Warm runs once in the guest before a template of this image is saved
	// (nil: nothing): what a VM's first command reads goes into the guest's
	// page cache, so every VM restored from the template starts it warm.
	Warm []string
}

// warmCommand is every image's Warm: each user's login shell (run as that
// user, so nothing it writes in a home changes owner) and Python with
// modules most programs import. Failures are ignored (an image may have no
// Python); under TCG a first bash -l took 403 ms in a fresh VM and 90 ms
// the second time, python3 1262 and 516 ms.
var warmCommand = []string{"sh", "-c", `for h in /root /home/*; do
	[ -d "$h" ] || continue
	u=$(stat -c %U "$h") && runuser -u "$u" -- env HOME="$h" bash -lic true </dev/null >/dev/null 2>&1
done
command -v python3 >/dev/null && python3 -c 'import json, os, re, subprocess, sys' >/dev/null 2>&1
true`}

const (
	kernelName = "vmlinuz"
	initrdName = "initrd.img"
	diskName   = "rootfs.qcow2"
)

// DefaultCacheDir returns $AGENTVM_CACHE_DIR, else $XDG_CACHE_HOME/agentvm,
// else ~/.cache/agentvm.
func DefaultCacheDir() string {
	if d := os.Getenv("AGENTVM_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "agentvm")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "agentvm")
}

// Ensure returns the cached image for the current recipe and agent, building
// whatever stage is missing (or both, with o.Force).
func Ensure(ctx context.Context, o Options) (*Image, error) {
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir()
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.AgentPath == "" {
		return nil, errors.New("image: AgentPath (the agentvm-guest binary) is required")
	}
	agentSum, err := fileSHA256(o.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("image: agent binary: %w", err)
	}
	name, err := Resolve(o.Name)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if IsOCIName(name) {
		o.Name = name
		return ensureOCI(o)
	}
	recipe := RecipeHash()
	fl := findFlavor(name)
	if fl != nil {
		recipe = fl.recipeHash()
	}
	hash := imageHash(recipe, agentSum, fl)
	img := newImage(o.CacheDir, hash)
	img.Name = name
	img.Warm = warmCommand
	if fl != nil {
		img.Ready = fl.ready
	}

	if !o.Force {
		if ok, err := img.complete(); ok {
			return img, nil
		} else if err != nil {
			return nil, err
		}
	}

	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	unlock, err := lockCache(ctx, filepath.Join(o.CacheDir, "lock"), o.Progress)
	if err != nil {
		return nil, err
	}
	defer unlock()

	// Another process may have built it while we waited for the lock.
	if !o.Force {
		if ok, err := img.complete(); ok {
			return img, nil
		} else if err != nil {
			return nil, err
		}
	}
	if err := checkTools(); err != nil {
		return nil, err
	}
	b := &builder{
		cacheDir:   o.CacheDir,
		recipe:     recipe,
		baseRecipe: RecipeHash(),
		flavor:     fl,
		hash:       hash,
		agentPath:  o.AgentPath,
		agentSum:   agentSum,
		force:      o.Force,
		progress:   o.Progress,
		imagesDir:  filepath.Join(o.CacheDir, "images"),
		rootfsBase: filepath.Join(o.CacheDir, "rootfs"),
	}
	b.removeStaleTemps()
	if err := b.build(ctx); err != nil {
		return nil, err
	}
	if ok, err := img.complete(); !ok {
		if err == nil {
			err = errors.New("image: build finished but the image is incomplete")
		}
		return nil, err
	}
	return img, nil
}

func newImage(cacheDir, hash string) *Image {
	dir := filepath.Join(cacheDir, "images", hash)
	return &Image{
		Hash:   hash,
		Dir:    dir,
		Kernel: filepath.Join(dir, kernelName),
		Initrd: filepath.Join(dir, initrdName),
		Disk:   filepath.Join(dir, diskName),
	}
}

// complete reports whether all files of the image exist, and fills SizeBytes.
func (img *Image) complete() (bool, error) {
	for _, p := range []string{img.Kernel, img.Initrd, img.Disk} {
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return false, nil
			}
			return false, fmt.Errorf("image: %w", err)
		}
	}
	size, err := qcow2VirtualSize(img.Disk)
	if err != nil {
		return false, fmt.Errorf("image: %s: %w", img.Disk, err)
	}
	img.SizeBytes = size
	return true, nil
}

// qcow2VirtualSize reads the virtual size from a qcow2 header.
func qcow2VirtualSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var hdr [32]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return 0, fmt.Errorf("read qcow2 header: %w", err)
	}
	if string(hdr[:4]) != "QFI\xfb" {
		return 0, errors.New("not a qcow2 file")
	}
	return int64(binary.BigEndian.Uint64(hdr[24:32])), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockCache takes an exclusive flock on path, polling so ctx can cancel.
func lockCache(ctx context.Context, path string, progress Progress) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("image: lock: %w", err)
	}
	waiting := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("image: lock %s: %w", path, err)
		}
		if !waiting {
			waiting = true
			progress("waiting for another process building the image")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
