package vm

import (
	"context"
	"fmt"
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
