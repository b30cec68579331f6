package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/store"
)

// The warm pool keeps a few VMs per recently used shape already restored from their
// template, with their network configured and the paths a create runs through
// exercised once. Under TCG most of a create is QEMU translating guest code that runs
// for the first time in the new process; a pooled VM has done that ahead of time, so
// a create that finds one only pushes the new identity. Pool VMs are rows in state
// "pool", hidden from the API; they are destroyed when the server stops or restarts.

// claimPooled turns a ready pool VM into the requested VM. It returns a nil VM and
// error when no pool VM of this shape is ready; the caller then restores a new one.
// created is false when an idempotency key matched an earlier VM.
func (s *Service) claimPooled(ctx context.Context, o CreateOptions, imgSize int64) (v *store.VM, created bool, err error) {
	key := poolKey{o.Image, o.CPUs, o.MemoryMiB}
	for {
		id := s.pool.pop(key)
		if id == "" {
			return nil, false, nil
		}
		v, created, err := s.claim(ctx, id, o, imgSize)
		if err == nil || errors.Is(err, ErrConflict) {
			return v, created, err
		}
		s.log.Warn("pool VM unusable, trying the next", "vm", id, "err", err)
	}
}

func (s *Service) claim(ctx context.Context, id string, o CreateOptions, imgSize int64) (*store.VM, bool, error) {
	start := time.Now()
	unlock := s.ops.lock(id, "create")
	defer unlock()
	v, err := s.store.GetVMFresh(ctx, id)
	in := s.instance(id)
	if err != nil || v.State != statePool || in == nil {
		return nil, false, fmt.Errorf("pool VM %s is gone", id)
	}
	h := s.hold(v, unlock)
	name := o.Name
	if name == "" {
		name = v.ID
	}
	v.Name, v.Labels, v.Env, v.IdempotencyKey, v.DiskBytes = name, o.Labels, o.Env, o.IdempotencyKey, o.DiskBytes
	v.Network, v.Egress = o.Network, o.Egress
	v.IdleTimeoutSec, v.DeleteAfterSec, v.Restart = int64(o.IdleTimeout.Seconds()), int64(o.DeleteAfter.Seconds()), o.Restart
	if err := h.enter(ctx, store.StateCreating); err != nil {
		if !errors.Is(err, store.ErrConflict) {
			h.destroy(context.Background()) // its record is in doubt
			return nil, false, err
		}
		// the name or key was taken meanwhile: the pool VM is still good
		v.Name, v.IdempotencyKey = "pool-"+v.ID, ""
		s.pool.push(poolKey{v.Image, v.CPUs, v.MemoryMiB}, v.ID)
		if o.IdempotencyKey != "" {
			if prev, e := s.store.GetVMByIdempotencyKey(ctx, o.IdempotencyKey); e == nil {
				return prev, false, nil
			}
		}
		return nil, false, fmt.Errorf("%w: a VM named %q already exists", ErrConflict, name)
	}
	fail := func(err error) (*store.VM, bool, error) {
		h.destroy(context.Background())
		return nil, false, err
	}
	s.setMachineOOMScore(in.machine.PID(), v.State) // someone's now: no longer first to go
	s.nets.apply(v)
	resize := o.DiskBytes > imgSize
	if resize {
		if err := in.machine.BlockResize(ctx, o.DiskBytes); err != nil {
			return fail(err)
		}
	}
	agent, err := in.guestClient(ctx)
	if err != nil {
		return fail(err)
	}
	if err := agent.SetIdentity(ctx, guest.Identity{Hostname: v.Name, MachineID: v.MachineID, Env: v.Env,
		TimeUnixNano: time.Now().UnixNano(), Seed: []byte(randHex(32)), DiskResize: resize}); err != nil {
		return fail(fmt.Errorf("set guest identity: %w", err))
	}
	now := time.Now().UTC()
	v.StartedAt, v.CreatedAt = &now, now
	v.Source = "warm pool (template " + v.Template + ")"
	if err := h.finishCreate(ctx, start); err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// refillPool tops the pool of one shape up in the background, one VM at a
// time, after recording the shape as the most recently created one.
func (s *Service) refillPool(key poolKey) {
	if s.cfg.PoolSize <= 0 {
		return
	}
	s.destroyPooled(s.pool.touch(key))
	if !s.pool.startFill(key) {
		return
	}
	go func() {
		defer s.pool.endFill(key)
		for s.pool.wants(key) {
			if err := s.fillOne(key); err != nil {
				s.log.Warn("warm pool refill failed", "shape", key.String(), "err", err)
				return
			}
		}
	}()
}

func (s *Service) fillOne(key poolKey) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := s.ImageNamed(ctx, key.image)
	if err != nil {
		return err
	}
	if err := s.room(key.mem, 0); err != nil { // not a refusal anyone sees
		return err
	}
	v, _, err := s.insertRow(ctx, CreateOptions{Image: key.image, CPUs: key.cpus, MemoryMiB: key.mem, DiskBytes: img.SizeBytes, pool: true})
	if err != nil {
		return err
	}
	h := s.hold(v, s.ops.lock(v.ID, "create"))
	defer h.release()
	if err := h.restore(ctx); err != nil { // network, clock and seed are pushed here
		h.destroy(context.Background())
		return err
	}
	if s.pool.isClosed() {
		h.destroy(context.Background())
		return errors.New("server is stopping")
	}
	// Run once through what a claim and a first exec run, so that QEMU has
	// translated that guest code before anyone waits for it.
	in := s.instance(v.ID)
	agent, err := in.guestClient(ctx)
	if err == nil {
		err = agent.SetIdentity(ctx, guest.Identity{Hostname: "agentvm", MachineID: randHex(16), Env: map[string]string{},
			TimeUnixNano: time.Now().UnixNano(), Seed: []byte(randHex(32))})
	}
	if err == nil {
		_, err = agent.Run(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
	}
	if err == nil && len(img.Ready) > 0 {
		// and through the image's service (the code interpreter's HTTP
		// path), which this QEMU process has not run yet either
		err = waitReady(ctx, agent, img)
	}
	if err != nil {
		h.destroy(context.Background())
		return err
	}
	if err := s.store.UpdateVM(ctx, v); err != nil { // its pid; it stays in the pool state
		h.destroy(context.Background())
		return err
	}
	s.pool.push(key, v.ID)
	s.log.Info("warm pool VM ready", "vm", v.ID, "shape", key.String())
	return nil
}

// WarmPool fills the pool of an image and shape (used at start-up).
func (s *Service) WarmPool(imageName string, cpus int, memMiB int64) error {
	canon, err := recordedImage(imageName)
	if err != nil {
		return err
	}
	s.refillPool(poolKey{canon, cpus, memMiB})
	return nil
}

// drainPool destroys every pool VM (server shutdown) and stops refills.
func (s *Service) drainPool(ctx context.Context) {
	select {
	case <-s.pool.close(): // a refill under way finishes or undoes itself
	case <-ctx.Done():
	}
	vms, err := s.localVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.State == statePool {
			s.destroyIfPooled(ctx, v.ID)
		}
	}
}

// PoolReady counts ready pool VMs per shape, keyed "<cpus>x<memory MiB>",
// prefixed "<image>/" for images other than the default.
func (s *Service) PoolReady() map[string]int { return s.pool.counts() }

// destroyPooled destroys the pool VMs of shapes the pool no longer keeps.
func (s *Service) destroyPooled(ids []string) {
	for _, id := range ids {
		s.destroyIfPooled(context.Background(), id)
	}
}

// destroyIfPooled destroys VM id, under its lock, if it is still a pool VM
// (a claim may have taken it meanwhile). It waits for the lock until ctx
// ends, then leaves the VM (to the next start's Reconcile).
func (s *Service) destroyIfPooled(ctx context.Context, id string) {
	unlock, err := s.ops.wait(ctx, id, "drain pool")
	if err != nil {
		s.log.Warn("pool VM busy: left for the next start", "vm", id, "err", err)
		return
	}
	defer unlock()
	if v, err := s.store.GetVMFresh(ctx, id); err == nil && v.State == statePool {
		s.hold(v, unlock).destroy(ctx)
	}
}
