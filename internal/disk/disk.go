// Package disk owns VM disks as qcow2 chains: a read-only base (an image's
// or a template's disk), frozen layers that snapshots and forks share, and
// each VM's writable top. It makes overlays, reads and resizes images with
// qemu-img, names new layers and collects the ones nothing uses. Which
// layers are in use is the caller's knowledge (its records); live changes
// to a running VM's chain (freezing a layer, flattening) go through the
// hypervisor.
package disk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// MaxLayers is how many frozen layers a VM's chain may grow to before it
// is flattened, so reads stay fast and unused layers can be collected.
const MaxLayers = 6

// Overlay makes a qcow2 overlay at path on backing; size 0 keeps the
// backing's size.
func Overlay(ctx context.Context, backing, path string, size int64) error {
	args := []string{"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, "-o", "cluster_size=65536", path}
	if size > 0 {
		args = append(args, fmt.Sprint(size))
	}
	return qemuImg(ctx, "create overlay", args...)
}

// OverlayOfLive is Overlay on a backing file a running QEMU writes to:
// qemu-img does not open it (-u), so size, the backing file's virtual size,
// is required.
func OverlayOfLive(ctx context.Context, backing, path string, size int64) error {
	if size <= 0 {
		return fmt.Errorf("create overlay %s: the size of %s is needed", path, backing)
	}
	return qemuImg(ctx, "create overlay", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, "-u",
		"-o", "cluster_size=65536", path, fmt.Sprint(size))
}

// Resize sets the virtual size of the image at path (not in use by a
// running VM).
func Resize(ctx context.Context, path string, size int64) error {
	return qemuImg(ctx, "resize", "resize", "-q", path, fmt.Sprint(size))
}

// Backing returns the backing file of the image at path ("" for a base).
func Backing(ctx context.Context, path string) (string, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		return "", fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	var info struct {
		Full string `json:"full-backing-filename"`
		B    string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	if info.Full != "" {
		return info.Full, nil
	}
	return info.B, nil
}

func qemuImg(ctx context.Context, what string, args ...string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %v: %s", what, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Layers is the directory of disk layers that can outlive their VM: every
// VM's writable top and the frozen layers snapshots and forks share.
type Layers struct{ Dir string }

// NewPath names a new layer of owner (a VM id); nothing is created.
func (l Layers) NewPath(owner string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return filepath.Join(l.Dir, owner+"-"+hex.EncodeToString(b)+".qcow2")
}

// Collect deletes the layers for which used is false and that are older
// than minAge (a younger file may belong to an operation that has not
// recorded it yet), and returns the paths it deleted.
func (l Layers) Collect(used func(path string) bool, minAge time.Duration) []string {
	ents, _ := os.ReadDir(l.Dir)
	var removed []string
	for _, e := range ents {
		p := filepath.Join(l.Dir, e.Name())
		info, err := e.Info()
		if err != nil || used(p) || time.Since(info.ModTime()) < minAge {
			continue
		}
		if os.Remove(p) == nil {
			removed = append(removed, p)
		}
	}
	return removed
}

// Chain returns the files of the image at top's backing chain, top first
// and its base last.
func Chain(ctx context.Context, top string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "-U", "--backing-chain", "--output=json", top).Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %w", top, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %w", top, err)
	}
	chain := make([]string, 0, len(infos))
	for _, in := range infos {
		chain = append(chain, in.Filename)
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("qemu-img info %s: no image", top)
	}
	return chain, nil
}

// Rebase points the image at path at a new backing file of the same
// content (an unsafe rebase: nothing is copied), or makes it a base with
// backing "".
func Rebase(ctx context.Context, path, backing string) error {
	if backing == "" {
		return qemuImg(ctx, "rebase", "rebase", "-q", "-u", "-b", "", path)
	}
	return qemuImg(ctx, "rebase", "rebase", "-q", "-u", "-F", "qcow2", "-b", backing, path)
}

// TopEmpty reports whether the image at path holds nothing of its own yet
// (every cluster reads through to its backing file), and names that file.
func TopEmpty(ctx context.Context, path string) (backing string, empty bool, err error) {
	if backing, err = Backing(ctx, path); err != nil || backing == "" {
		return backing, false, err
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "map", "-U", "--output=json", path).Output()
	if err != nil {
		return "", false, fmt.Errorf("qemu-img map %s: %w", path, err)
	}
	var ranges []struct {
		Depth   int  `json:"depth"`
		Present bool `json:"present"`
	}
	if err := json.Unmarshal(out, &ranges); err != nil {
		return "", false, fmt.Errorf("qemu-img map %s: %w", path, err)
	}
	for _, r := range ranges {
		if r.Depth == 0 && r.Present {
			return backing, false, nil
		}
	}
	return backing, true, nil
}
