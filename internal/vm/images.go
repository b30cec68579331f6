package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/agentvm/agentvm/internal/image"
)

// images are the guest images VMs boot and restore from, each built on
// first use, once (Config.EnsureImage; image.Ensure by default). The
// Service embeds it: Image and ImageNamed are its API.
type images struct {
	ensure    func(context.Context, image.Options) (*image.Image, error)
	cacheDir  string
	agentPath string
	progress  func(string)

	mu    sync.Mutex
	slots map[string]*imageSlot // by canonical name

	// user names this daemon (its data dir) among the users of an image
	// made from an OCI image: the image cache is the host's, shared by
	// every daemon on it, and each keeps its own VMs' records.
	user string
}

// imageSlot holds one image, built once.
type imageSlot struct {
	mu  sync.Mutex
	img *image.Image
}

// Image returns the default image, building it on first use.
func (is *images) Image(ctx context.Context) (*image.Image, error) {
	return is.ImageNamed(ctx, image.Default)
}

// ImageNamed returns an image by name or alias ("" is the default), building
// it on first use.
func (is *images) ImageNamed(ctx context.Context, name string) (*image.Image, error) {
	canon, err := image.Resolve(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	is.mu.Lock()
	if is.slots == nil {
		is.slots = map[string]*imageSlot{}
	}
	slot := is.slots[canon]
	if slot == nil {
		slot = &imageSlot{}
		is.slots[canon] = slot
	}
	is.mu.Unlock()
	// One build per image at a time; other images (and callers of a built
	// one) do not wait for it. The build does not stop when the caller that
	// started it gives up: a retry finds it done.
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.img != nil {
		return slot.img, nil
	}
	img, err := is.ensure(context.WithoutCancel(ctx), image.Options{CacheDir: is.cacheDir, AgentPath: is.agentPath, Name: canon, Progress: is.progress})
	if err != nil {
		return nil, fmt.Errorf("%s image: %w", canon, err)
	}
	if image.IsOCIName(canon) {
		if err := is.markUsed(ctx, canon); err != nil {
			return nil, fmt.Errorf("%s image: %w", canon, err)
		}
	}
	slot.img = img
	return img, nil
}

// MakeImage packs tree, an OCI image's root filesystem a template build
// prepared, as the image name (image.OCIName), and returns it.
func (is *images) MakeImage(ctx context.Context, name, tree string) (*image.Image, error) {
	if _, err := image.FromTree(ctx, image.Options{CacheDir: is.cacheDir, AgentPath: is.agentPath, Progress: is.progress}, name, tree); err != nil {
		return nil, err
	}
	return is.ImageNamed(ctx, name)
}

// OCIImages lists the images made from OCI images in this host's cache.
func (is *images) OCIImages() []string {
	dirs, _ := filepath.Glob(filepath.Join(is.cacheDir, "images", "oci-*"))
	var out []string
	for _, d := range dirs {
		if n := filepath.Base(d); image.IsOCIName(n) {
			out = append(out, n)
		}
	}
	return out
}

// usersDir holds a file per daemon that may have made VMs of an image
// made from an OCI image.
func (is *images) usersDir(name string) string {
	return filepath.Join(is.cacheDir, "images", name+".users")
}

// markUsed notes this daemon among the users of an OCI image's image,
// under the cache's lock (a prune elsewhere checks the users under it).
func (is *images) markUsed(ctx context.Context, name string) error {
	unlock, err := image.LockCache(ctx, is.cacheDir)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(is.cacheDir, "images", name)); err != nil {
		return fmt.Errorf("%w (removed by another daemon?)", err)
	}
	if err := os.MkdirAll(is.usersDir(name), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(is.usersDir(name), is.user), nil, 0o644)
}

// RemoveImage deletes an image made from an OCI image, and its cold-booted
// templates, when no VM or snapshot (of any node) was made from it: their
// disks are layers over its files. ErrConflict names one that was, or says
// that another daemon on this host uses the image.
func (s *Service) RemoveImage(ctx context.Context, name string) error {
	if !image.IsOCIName(name) {
		return fmt.Errorf("%w: %s is not an image made from an OCI image", ErrInvalid, name)
	}
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		return err
	}
	for _, v := range vms {
		if v.Image == name {
			return fmt.Errorf("%w: VM %s was made from image %s", ErrConflict, v.Name, name)
		}
	}
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Image == name {
			return fmt.Errorf("%w: snapshot %s was made from image %s", ErrConflict, sn.Name, name)
		}
	}
	is := s.images
	unlock, err := image.LockCache(ctx, is.cacheDir)
	if err != nil {
		return err
	}
	defer unlock()
	is.mu.Lock()
	delete(is.slots, name) // a next use marks this daemon again
	is.mu.Unlock()
	os.Remove(filepath.Join(is.usersDir(name), is.user))
	if others, _ := os.ReadDir(is.usersDir(name)); len(others) > 0 {
		return fmt.Errorf("%w: image %s is used by another daemon on this host (%s)", ErrConflict, name, others[0].Name())
	}
	tpls, _ := s.tpl.list()
	for _, t := range tpls {
		if t.ImageHash == name {
			if err := os.RemoveAll(t.Dir); err != nil {
				return err
			}
			os.Remove(t.Dir + ".lock")
		}
	}
	if err := os.RemoveAll(filepath.Join(is.cacheDir, "images", name)); err != nil {
		return err
	}
	return os.RemoveAll(is.usersDir(name))
}

// imageUser names a daemon among an image's users: its data dir, as a file
// name ('/' as '%').
func imageUser(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	if len(abs) > 200 { // a file name's limit is 255 bytes
		sum := sha256.Sum256([]byte(abs))
		return "sha256-" + hex.EncodeToString(sum[:])
	}
	return strings.ReplaceAll(strings.ReplaceAll(abs, "%", "%25"), "/", "%")
}
