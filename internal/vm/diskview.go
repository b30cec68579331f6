package vm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/store"
)

// DiskView is a VM's disk at one instant, for reading from the host
// (agentvm diff): its qcow2 chain, top first, and the point it was made
// from. Release it when done: until then the VM's operation lock is held,
// so no operation writes its top, freezes, flattens or deletes its layers.
type DiskView struct {
	VM *store.VM
	// Top is the chain's top file as read: a running or paused VM's frozen
	// layer, a stopped or suspended VM's own top.
	Top string
	// Created is the file the VM's chain began from (a template's disk, a
	// snapshot's or a parent's frozen layer), or "" when a flatten merged
	// it away; CreatedNote says what it is.
	Created     string
	CreatedNote string
	release     func()
}

// Release ends the view.
func (d *DiskView) Release() { d.release() }

// ViewDisk holds the VM and gives its disk at this instant without running
// anything in the guest. A running or paused VM's top is frozen under a
// new one first, as a snapshot does (crash-consistent: what the guest's
// kernel has written by then; the new layer joins the chain, flattened
// with the others past disk.MaxLayers); a stopped, crashed or suspended
// VM's chain is read as it is.
func (s *Service) ViewDisk(ctx context.Context, idOrName string) (*DiskView, error) {
	h, err := s.settled(ctx, idOrName, opDiff)
	if err != nil {
		return nil, err
	}
	v := h.v
	top := s.diskPath(v)
	if v.State == store.StateRunning || v.State == store.StatePaused {
		if base, empty, _ := disk.TopEmpty(ctx, top); empty && len(v.Layers) > 0 && base == v.Layers[len(v.Layers)-1] {
			// Nothing written since the last freeze (an earlier diff's, a
			// snapshot's): its layer is this instant, and a diff in a loop
			// does not pile up layers.
			top = base
		} else if top, err = h.freezeDisk(ctx); err != nil {
			h.release()
			return nil, err
		}
	}
	chain, err := disk.Chain(ctx, top)
	if err != nil {
		h.release()
		return nil, err
	}
	d := &DiskView{VM: v, Top: top, release: h.release}
	// The first file of the chain not made by this VM: its layers are
	// named after it (disk.Layers.NewPath).
	for _, f := range chain {
		if !strings.HasPrefix(filepath.Base(f), v.ID+"-") {
			d.Created = f
			break
		}
	}
	switch {
	case d.Created == "":
		d.CreatedNote = "no file of the chain is older than the VM"
	case strings.HasPrefix(d.Created, s.layers().Dir+string(filepath.Separator)):
		d.CreatedNote = "the frozen layer it was made from (" + v.Source + ")"
	case v.Source != "":
		// Made from a snapshot or a parent, whose layers a flatten
		// merged into the VM's own: only the template is left.
		d.CreatedNote = "the template under what it was made from (" + v.Source + "): its layers were flattened"
	default:
		d.CreatedNote = "the template it was made from"
	}
	return d, nil
}

// freezeDisk freezes a running or paused VM's writable top under a new
// one and records it, and returns the frozen layer.
func (h *held) freezeDisk(ctx context.Context) (string, error) {
	s, v := h.s, h.v
	in, err := h.attached()
	if err != nil {
		return "", err
	}
	frozen, newTop, commit, abort, err := h.prepareFreeze(ctx, in)
	if err != nil {
		return "", err
	}
	defer abort()
	if err := commit(ctx); err != nil {
		if top, qerr := in.machine.DiskTop(context.Background()); qerr != nil || top != newTop {
			return "", fmt.Errorf("freeze the disk: %w", err)
		}
		// QEMU switched although the answer was lost: record it.
	}
	if err := h.recordFreeze(ctx, frozen, newTop); err != nil {
		return "", err
	}
	s.flattenIfDeep(v) // waits for the view's release: it takes the lock
	return frozen, nil
}
