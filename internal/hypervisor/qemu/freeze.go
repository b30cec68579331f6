package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
)

// PrepareFreeze makes ready a freeze of the disk's current top under a new
// overlay at newTop, before a save: the overlay's file is made (naming the
// top as its backing file) and QEMU opens it as a block node of its own.
// commit then only switches the guest's writes to it (blockdev-snapshot),
// which is all a live save's pause has to wait for: making the image there
// (blockdev-snapshot-sync) held the guest stopped while qemu-img's work
// and the image's first writes were done. abort undoes a freeze that was
// not committed: the node is closed and the file removed (the only place a
// capture's unused new top is removed).
func (m *Machine) PrepareFreeze(ctx context.Context, newTop string) (commit func(context.Context) error, abort func(), err error) {
	top, size, err := m.diskTop(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !filepath.IsAbs(top) {
		// A json: pseudo-filename (a node opened with options its file
		// name does not say) would be no backing file for the overlay.
		return nil, nil, fmt.Errorf("the disk's top %q is not a file path", top)
	}
	if err := disk.OverlayOfLive(ctx, top, newTop, size); err != nil {
		os.Remove(newTop)
		return nil, nil, err
	}
	node := "top" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := m.qmp.Execute(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": node, "discard": "unmap",
		"file":    map[string]any{"driver": "file", "filename": newTop},
		"backing": nil, // it gets the current top at the switch
	}); err != nil {
		os.Remove(newTop)
		return nil, nil, fmt.Errorf("open the new disk top: %w", err)
	}
	var committed atomic.Bool
	commit = func(ctx context.Context) error {
		// Not cut short by the caller: QEMU may switch after a cancelled
		// wait, and abort must then not take the file away.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := m.qmp.Execute(cctx, "blockdev-snapshot", map[string]any{"node": "disk0", "overlay": node}); err != nil {
			return err
		}
		committed.Store(true)
		return nil
	}
	abort = func() {
		if committed.Load() {
			return
		}
		actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A node a live QEMU will not let go of may be the guest's disk
		// now (a switch whose answer was lost): its file stays, for the
		// layer collector to judge by the records. A QEMU that is gone
		// holds nothing.
		_, err := m.qmp.Execute(actx, "blockdev-del", map[string]any{"node-name": node})
		if err == nil || m.qmpGone() {
			os.Remove(newTop)
		}
	}
	return commit, abort, nil
}

// qmpGone reports whether QEMU's QMP connection has closed (QEMU exited).
func (m *Machine) qmpGone() bool {
	select {
	case <-m.qmp.Done():
		return true
	default:
		return false
	}
}

// DiskTop returns the file QEMU is writing the disk to (the top of its chain).
func (m *Machine) DiskTop(ctx context.Context) (string, error) {
	top, _, err := m.diskTop(ctx)
	return top, err
}

// diskTop is the top of disk0's chain and its virtual size.
func (m *Machine) diskTop(ctx context.Context) (string, int64, error) {
	r, err := m.qmp.Execute(ctx, "query-block", nil)
	if err != nil {
		return "", 0, err
	}
	var devs []struct {
		Device   string `json:"device"`
		Inserted struct {
			File  string `json:"file"`
			Image struct {
				VirtualSize int64 `json:"virtual-size"`
			} `json:"image"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(r, &devs); err != nil {
		return "", 0, err
	}
	for _, d := range devs {
		if d.Device == "disk0" {
			return d.Inserted.File, d.Inserted.Image.VirtualSize, nil
		}
	}
	return "", 0, fmt.Errorf("no disk0 in query-block")
}
