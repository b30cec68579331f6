package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// Reaching a VM: its record (Get, GetFresh, List), its agent session
// (Guest), a TCP connection into it (DialGuest, DialPort) and its log
// (Logs). Guest, DialGuest and DialPort wake a paused or suspended VM first.

// Get finds a VM by id or name, from the store's read cache when it may:
// for routing and for answers. What decides or changes a VM reads it with
// GetFresh.
func (s *Service) Get(ctx context.Context, idOrName string) (*store.VM, error) {
	return s.get(ctx, idOrName, s.store.GetVM)
}

// GetFresh is Get from the database (store.GetVMFresh): on PostgreSQL
// another node's write shows in it at once.
func (s *Service) GetFresh(ctx context.Context, idOrName string) (*store.VM, error) {
	return s.get(ctx, idOrName, s.store.GetVMFresh)
}

func (s *Service) get(ctx context.Context, idOrName string, read func(context.Context, string) (*store.VM, error)) (*store.VM, error) {
	v, err := read(ctx, idOrName)
	if err == nil && v.State == statePool {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no VM named or with id %q", ErrNotFound, idOrName)
	}
	return v, err
}

// List returns all VMs (not the warm pool).
func (s *Service) List(ctx context.Context) ([]*store.VM, error) {
	vms, err := s.store.ListVMs(ctx)
	out := vms[:0]
	for _, v := range vms {
		if v.State != statePool {
			out = append(out, v)
		}
	}
	return out, err
}

// Guest returns the agent session of a running VM, resuming a paused VM and waking
// a suspended one first.
func (s *Service) Guest(ctx context.Context, idOrName string) (*store.VM, *guest.Client, error) {
	v, err := s.Wake(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	if err := checkTransition(opExec, v); err != nil {
		return nil, nil, err
	}
	in := s.instance(v.ID)
	if in == nil {
		return nil, nil, fmt.Errorf("%w: VM %s is %s but not attached", ErrUnavailable, v.Name, v.State)
	}
	c, err := in.guestClient(ctx)
	return v, c, err
}

// DialGuest opens a TCP connection to port inside a running VM through its virtual network.
func (s *Service) DialGuest(ctx context.Context, idOrName string, port int) (net.Conn, error) {
	v, err := s.Wake(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if err := checkTransition(opExec, v); err != nil {
		return nil, err
	}
	in, err := s.attached(v)
	if err != nil {
		return nil, err
	}
	c, err := in.net.DialGuest(ctx, port)
	if errors.Is(err, network.ErrRefused) {
		return nil, fmt.Errorf("%w: %w: %w: connect to port %d on the address of %s: %w", ErrUnavailable, ErrGuestDial, ErrNoListener, port, v.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w: connect to port %d in %s: %w", ErrUnavailable, ErrGuestDial, port, v.Name, err)
	}
	return c, nil
}

// Logs returns the VM log (serial console and QEMU output), at most its last maxBytes.
func (s *Service) Logs(ctx context.Context, idOrName string, maxBytes int64) (io.ReadCloser, error) {
	v, err := s.Get(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(s.paths(v.ID).Log)
	if err != nil {
		return nil, fmt.Errorf("%w: no log for %s yet", ErrNotFound, v.Name)
	}
	if st, err := f.Stat(); err == nil && st.Size() > maxBytes {
		f.Seek(st.Size()-maxBytes, io.SeekStart)
	}
	return f, nil
}

// DialPort connects to a TCP port inside a VM, waking it first: through
// its virtual network to the guest's address, or, when nothing listens
// there (a server bound to the guest's loopback, as dev servers often are),
// through the guest agent from inside the guest.
func (s *Service) DialPort(ctx context.Context, idOrName string, port int) (net.Conn, error) {
	c, err := s.DialGuest(ctx, idOrName, port)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, network.ErrRefused) {
		return nil, err
	}
	_, gc, gerr := s.Guest(ctx, idOrName)
	if gerr != nil {
		return nil, err
	}
	c, lerr := gc.DialTCP(ctx, "127.0.0.1", port)
	if lerr != nil {
		return nil, fmt.Errorf("%w: %w: connect to port %d: connection refused (nothing listens on it, on the guest address or its loopback)", ErrUnavailable, ErrNoListener, port)
	}
	return c, nil
}
