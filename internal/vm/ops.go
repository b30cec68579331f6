package vm

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// A user-requested lifecycle operation that succeeds (a no-op and an
// idempotent replay included: the caller asked and got an answer) becomes an
// event naming who asked and how long it took, and a latency sample for the
// OnOp subscribers (the metrics): the operation records it where it
// happens, not the HTTP layer. Internal callers (policies, shutdown, pool)
// carry no actor and record their own events.

type actorKey struct{}

// WithActor marks ctx as a request by actor (auth.Principal.Actor: "admin",
// "admin:<id>", "token:<id>").
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorOf(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// OnOp registers fn to run after every recorded operation.
func (s *Service) OnOp(fn func(op string, took time.Duration)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onOp = append(s.onOp, fn)
}

// record runs a user-requested operation and records it (see opRecord):
// what names the VM it acted on and the event's detail.
func record[T any](s *Service, ctx context.Context, op string, run func() (T, error), what func(T) (vmID, extra string)) (T, error) {
	start := time.Now()
	res, err := run()
	actor := actorOf(ctx)
	if err != nil || actor == "" {
		return res, err
	}
	vmID, extra := what(res)
	if vmID == "" {
		return res, err
	}
	took := time.Since(start)
	msg := fmt.Sprintf("%s (%s)", op, took.Round(time.Millisecond))
	if extra != "" {
		msg += ": " + extra
	}
	s.EventData(vmID, "lifecycle", actor, map[string]string{"op": op, "ms": strconv.FormatInt(took.Milliseconds(), 10)}, "%s", msg)
	s.mu.Lock()
	fns := append([]func(string, time.Duration){}, s.onOp...)
	s.mu.Unlock()
	for _, fn := range fns {
		fn(op, took)
	}
	return res, err
}

func vmOf(v *store.VM) (string, string) { return v.ID, "" }
func opVM(r *OpResult) (string, string) { return r.VM.ID, "" }

// Create makes a VM (see create).
func (s *Service) Create(ctx context.Context, o CreateOptions) (*store.VM, bool, error) {
	var created bool
	v, err := record(s, ctx, "create", func() (v *store.VM, err error) {
		v, created, err = s.create(ctx, o)
		return v, err
	}, func(v *store.VM) (string, string) { return v.ID, "as " + v.Name })
	return v, created, err
}

// CreateFrom makes a VM from a snapshot (see createFrom).
func (s *Service) CreateFrom(ctx context.Context, snap string, o CreateOptions) (*store.VM, bool, error) {
	var created bool
	v, err := record(s, ctx, "create", func() (v *store.VM, err error) {
		v, created, err = s.createFrom(ctx, snap, o)
		return v, err
	}, func(v *store.VM) (string, string) { return v.ID, "as " + v.Name })
	return v, created, err
}

// Stop shuts a VM down (see stop).
func (s *Service) Stop(ctx context.Context, idOrName string) (*store.VM, error) {
	return record(s, ctx, opStop, func() (*store.VM, error) { return s.stop(ctx, idOrName) }, vmOf)
}

// Start boots, resumes or wakes a VM (see start).
func (s *Service) Start(ctx context.Context, idOrName string) (*store.VM, error) {
	return record(s, ctx, opStart, func() (*store.VM, error) { return s.start(ctx, idOrName) }, vmOf)
}

// Delete removes a VM (see remove).
func (s *Service) Delete(ctx context.Context, idOrName string) error {
	id := ""
	if v, err := s.GetFresh(ctx, idOrName); err == nil {
		id = v.ID
	}
	_, err := record(s, ctx, opDelete, func() (struct{}, error) { return struct{}{}, s.remove(ctx, idOrName) },
		func(struct{}) (string, string) { return id, "" })
	return err
}

// Pause freezes a VM's vCPUs (see pause).
func (s *Service) Pause(ctx context.Context, idOrName string) (*OpResult, error) {
	return record(s, ctx, opPause, func() (*OpResult, error) { return s.pause(ctx, idOrName) }, opVM)
}

// Resume continues a paused VM (see resume).
func (s *Service) Resume(ctx context.Context, idOrName string) (*OpResult, error) {
	return record(s, ctx, opResume, func() (*OpResult, error) { return s.resume(ctx, idOrName) }, opVM)
}

// Suspend saves a VM's state to disk and ends its QEMU (see suspend).
func (s *Service) Suspend(ctx context.Context, idOrName string) (*OpResult, error) {
	return record(s, ctx, opSuspend, func() (*OpResult, error) { return s.suspend(ctx, idOrName) }, opVM)
}

// Resize grows a VM (see resize).
func (s *Service) Resize(ctx context.Context, idOrName string, o ResizeOptions) (*ResizeResult, error) {
	return record(s, ctx, opResize, func() (*ResizeResult, error) { return s.resize(ctx, idOrName, o) },
		func(r *ResizeResult) (string, string) { return r.VM.ID, "" })
}

// Snapshot captures a VM (see snapshot).
func (s *Service) Snapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error) {
	return record(s, ctx, opSnapshot, func() (*store.Snapshot, error) { return s.snapshot(ctx, idOrName, name) },
		func(sn *store.Snapshot) (string, string) { return sn.VMID, "snapshot " + sn.Name })
}

// Fork makes running copies of a VM (see fork).
func (s *Service) Fork(ctx context.Context, idOrName string, count int) (*ForkResult, error) {
	return s.ForkWith(ctx, idOrName, ForkOptions{Count: count})
}

// ForkWith is Fork with options.
func (s *Service) ForkWith(ctx context.Context, idOrName string, o ForkOptions) (*ForkResult, error) {
	return record(s, ctx, opFork, func() (*ForkResult, error) { return s.fork(ctx, idOrName, o) },
		func(r *ForkResult) (string, string) {
			names := make([]string, 0, len(r.Children))
			for _, c := range r.Children {
				names = append(names, c.Name)
			}
			return r.Parent.ID, "children " + strings.Join(names, ", ")
		})
}
