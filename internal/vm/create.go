package vm

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
)

// CreateOptions are the validated inputs of a create.
type CreateOptions struct {
	Name           string
	CPUs           int
	MemoryMiB      int64
	DiskBytes      int64
	Labels         map[string]string
	Env            map[string]string
	IdempotencyKey string
	Network        string        // private network name ("" = none)
	Egress         *store.Egress // nil: the network's policy, else public
	IdleTimeout    time.Duration
	DeleteAfter    time.Duration
	Restart        string
	Image          string // image name or alias ("" is the default)

	pool bool // a warm-pool VM: hidden from the API until claimed
}

// Defaults for a create.
const (
	DefaultCPUs      = 1
	DefaultMemoryMiB = 1024
	DefaultDiskBytes = 8 << 30
	MinMemoryMiB     = 128
	MaxCPUs          = 64
)

var (
	nameRe  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	idRe    = regexp.MustCompile(`^vm-[0-9a-f]{12}$`)
	labelRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62})$`)
	envRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ValidateName checks a VM name: a DNS label, since it becomes the hostname.
func ValidateName(n string) error {
	if !nameRe.MatchString(n) {
		return fmt.Errorf("%w: invalid name %q: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit", ErrInvalid, n)
	}
	if idRe.MatchString(n) {
		return fmt.Errorf("%w: invalid name %q: names of the form vm-<12 hex digits> are reserved for VM ids", ErrInvalid, n)
	}
	return nil
}

// ValidEnv reports whether K=V is a usable environment variable (create and exec).
func ValidEnv(k, v string) bool { return envRe.MatchString(k) && !strings.ContainsRune(v, 0) }

// recordedImage is the image name a VM record holds for name (an image or
// an alias): the image's own name, and "" for the default image.
func recordedImage(name string) (string, error) {
	img, err := image.Resolve(name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if img == image.Default {
		return "", nil
	}
	return img, nil
}

// Validate fills defaults and checks every field.
func (o *CreateOptions) Validate() error {
	if err := checkEgress(o.Egress); err != nil {
		return err
	}
	img, err := recordedImage(o.Image)
	if err != nil {
		return err
	}
	o.Image = img
	if !ValidRestart(o.Restart) {
		return fmt.Errorf("%w: restart policy must be never, on-failure or always, got %q", ErrInvalid, o.Restart)
	}
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = DefaultMemoryMiB
	}
	if o.DiskBytes == 0 {
		o.DiskBytes = DefaultDiskBytes
	}
	if o.Name != "" {
		if err := ValidateName(o.Name); err != nil {
			return err
		}
	}
	if o.CPUs < 1 || o.CPUs > MaxCPUs {
		return fmt.Errorf("%w: cpus must be between 1 and %d, got %d", ErrInvalid, MaxCPUs, o.CPUs)
	}
	if o.MemoryMiB < MinMemoryMiB {
		return fmt.Errorf("%w: memory must be at least %d MiB, got %d MiB", ErrInvalid, MinMemoryMiB, o.MemoryMiB)
	}
	for k, v := range o.Labels {
		if !labelRe.MatchString(k) || len(v) > 256 {
			return fmt.Errorf("%w: invalid label %q: keys are 1-63 of [A-Za-z0-9._/-], values at most 256 bytes", ErrInvalid, k)
		}
	}
	for k, v := range o.Env {
		if !ValidEnv(k, v) {
			return fmt.Errorf("%w: invalid environment variable %q", ErrInvalid, k)
		}
	}
	if len(o.IdempotencyKey) > 200 {
		return fmt.Errorf("%w: idempotency key longer than 200 bytes", ErrInvalid)
	}
	if strings.IndexByte(o.IdempotencyKey, 0) >= 0 || !utf8.ValidString(o.IdempotencyKey) {
		return fmt.Errorf("%w: idempotency key with a NUL byte or invalid UTF-8", ErrInvalid)
	}
	return nil
}

// create makes a running VM by restoring the template of its shape onto a fresh
// overlay and giving it its own identity. On any failure nothing is left behind.
func (s *Service) create(ctx context.Context, o CreateOptions) (*store.VM, bool, error) {
	if err := o.Validate(); err != nil {
		return nil, false, err
	}
	if err := s.fence.check(); err != nil {
		return nil, false, err
	}
	if err := s.checkNetwork(ctx, o.Network); err != nil {
		return nil, false, err
	}
	if o.IdempotencyKey != "" {
		if v, err := s.store.GetVMByIdempotencyKey(ctx, o.IdempotencyKey); err == nil {
			return v, false, nil
		}
	}
	img, err := s.ImageNamed(ctx, o.Image)
	if err != nil {
		return nil, false, err
	}
	if o.DiskBytes < img.SizeBytes {
		return nil, false, fmt.Errorf("%w: disk must be at least %d MiB (the image size), got %d MiB", ErrInvalid, img.SizeBytes>>20, o.DiskBytes>>20)
	}
	if err := s.admit(o.MemoryMiB, o.DiskBytes-img.SizeBytes); err != nil {
		return nil, false, err
	}
	// Top the warm pool of this shape up once this create is done, so the refill
	// does not compete with it. Images made from OCI images are a template
	// build's (its first step's VM): a pool of them would only hold memory,
	// and the image, which prune removes once no VM is made from it.
	if !image.IsOCIName(o.Image) {
		defer s.refillPool(poolKey{o.Image, o.CPUs, o.MemoryMiB})
	}
	if o.Name != "" {
		if _, err := s.store.GetVMFresh(ctx, o.Name); err == nil {
			return nil, false, fmt.Errorf("%w: a VM named %q already exists", ErrConflict, o.Name)
		}
	}
	if v, created, err := s.claimPooled(ctx, o, img.SizeBytes); v != nil || err != nil {
		return v, created, err
	}
	v, prev, err := s.insertRow(ctx, o)
	if err != nil || prev != nil {
		return prev, false, err
	}
	h := s.hold(v, s.ops.lock(v.ID, "create"))
	defer h.release()
	start := time.Now()
	if err := h.restore(ctx); err != nil {
		s.log.Error("create failed", "vm", v.ID, "err", err)
		h.destroy(context.Background())
		return nil, false, err
	}
	return v, true, h.finishCreate(ctx, start)
}

// restore starts the VM from its shape's template and pushes its identity.
func (h *held) restore(ctx context.Context) error {
	s, v := h.s, h.v
	t, err := s.EnsureTemplate(ctx, v.Image, v.CPUs, v.MemoryMiB)
	if err != nil {
		return err
	}
	img, err := s.ImageNamed(ctx, v.Image) // its kernel
	if err != nil {
		return err
	}
	v.Template, v.Layout, v.HotMemoryMiB = t.Key, qemu.DeviceSet, 0
	p := s.paths(v.ID)
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(p.Run, 0o700); err != nil {
		return err
	}
	v.Disk = s.newLayerPath(v.ID)
	if err := s.store.UpdateVM(ctx, v); err != nil { // record the layer before making it
		return err
	}
	mc := s.machineConfig(v, p, img)
	mc.RAMPath, mc.Incoming, mc.IncomingShared = t.ram(), t.state(), true
	return h.launchOnOverlay(ctx, t.disk(), mc, launchOpts{agentTimeout: 30 * time.Second, baseDisk: t.DiskBytes, identity: identityNew})
}

// checkNetwork reports a missing private network as a 404.
func (s *Service) checkNetwork(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	if _, err := s.store.GetNetwork(ctx, name); err != nil {
		return fmt.Errorf("%w: no network %q (create it with: agentvm network create %s)", ErrNotFound, name, name)
	}
	return nil
}
