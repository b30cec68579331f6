package vm

import (
	"context"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// A held VM is one VM as one operation has it: taken under the VM's
// operation lock, with its record as it is while held, and the primitive
// steps that change it: enter (the state table), launch and restoreState
// (launch.go, steps.go), capture, quit, kill and destroy. Nothing else
// changes a VM while it is held (a wake on request and an exit's record
// queue on the same lock), so a step reads and writes h.v freely. User
// operations take one (take, settled, or hold for a VM they made) and are
// short compositions of its steps, one file each: pause.go, lifecycle.go
// (stop, start, delete), fork.go, snapshot.go, resize.go.
type held struct {
	s      *Service
	v      *store.VM
	unlock func()
}

// hold makes v, whose operation lock the caller took (unlock ends it), a
// held VM.
func (s *Service) hold(v *store.VM, unlock func()) *held {
	return &held{s: s, v: v, unlock: unlock}
}

// release ends the hold (the operation lock).
func (h *held) release() { h.unlock() }

// take finds a VM and takes it for a user-requested operation (409 if another one
// is in progress; the handling of an unexpected exit is waited for, up to
// 30 s), with the record as it is once the VM is held.
func (s *Service) take(ctx context.Context, idOrName, op string) (*held, error) {
	v, err := s.GetLocal(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	s.stash.stopUpload(uploadKey(v.ID)) // nor does any user operation
	unlock, err := s.ops.try(v.ID, v.Name, op)
	if err != nil && (!s.ops.isBusy(v.ID) || s.ops.busyWith(v.ID) == opExitHandling) {
		// The record of an unexpected exit is being written (the VM may
		// already show as crashed): that is short, and what op may do
		// depends on it, so wait for it rather than answer 409.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		unlock, err = s.ops.wait(wctx, v.ID, op)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	unlock = s.thenStore(v.ID, unlock)
	if v, err = s.GetFresh(ctx, v.ID); err != nil {
		unlock()
		return nil, err
	}
	return s.hold(v, unlock), nil
}

// settled is take plus the transition check of op.
func (s *Service) settled(ctx context.Context, idOrName, op string) (*held, error) {
	h, err := s.take(ctx, idOrName, op)
	if err != nil {
		return nil, err
	}
	if err := checkTransition(op, h.v); err != nil {
		h.release()
		return nil, err
	}
	return h, nil
}

// attached is the VM's live side, or a 503 when it has none.
func (h *held) attached() (*instance, error) { return h.s.attached(h.v) }

// quit ends the VM's machine, which saved what it needed (a suspend): an
// exit the monitor does not report.
func (h *held) quit(in *instance) {
	in.expect()
	in.machine.Quit()
	in.detach()
	h.s.setInstance(h.v.ID, nil)
}

// shutdown powers the guest off (ACPI, then quit, then kill, within
// timeout) and ends its machine, if it runs.
func (h *held) shutdown(ctx context.Context, timeout time.Duration) {
	in := h.s.instance(h.v.ID)
	if in == nil {
		return
	}
	in.expect()
	in.machine.Shutdown(ctx, timeout)
	in.detach()
	h.s.setInstance(h.v.ID, nil)
}

// kill ends the VM's machine at once, if it runs here: a launch whose
// record could not be written must not leave a QEMU the record does not
// name.
func (h *held) kill() {
	if in := h.s.instance(h.v.ID); in != nil {
		in.kill()
		h.s.setInstance(h.v.ID, nil)
	}
}
