package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// MaxLogBytes bounds a VM's log (serial console, QEMU's output and
// lifecycle lines). QEMU appends to the file itself, so a guest that writes
// to /dev/ttyS0 without end would otherwise fill the data dir that every VM
// and the database share. Past the bound the log keeps its newest half.
const MaxLogBytes = 16 << 20

// RunLogCap trims the logs of all VMs that grew past MaxLogBytes, checking
// every interval until ctx ends.
func (s *Service) RunLogCap(ctx context.Context, interval time.Duration) {
	every(ctx, interval, func(context.Context) {
		logs, _ := filepath.Glob(filepath.Join(s.cfg.DataDir, "vms", "*", "vm.log"))
		for _, p := range logs {
			if dropped, err := trimLog(p, MaxLogBytes); err != nil {
				s.log.Warn("trim VM log", "path", p, "err", err)
			} else if dropped > 0 {
				s.log.Info("VM log trimmed", "path", p, "dropped_bytes", dropped)
			}
		}
	})
}

// trimLog keeps the newest max/2 bytes of the log at path when it is larger
// than max, and reports how many bytes it dropped. The file is truncated in
// place rather than replaced because QEMU holds it open with O_APPEND: its
// next write lands at the new end. A line QEMU writes while the tail is
// being put back may land before it; nothing the guest writes can make the
// file grow past max by more than it writes between two checks.
func trimLog(path string, max int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if os.IsNotExist(err) {
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= max {
		return 0, err
	}
	keep := max / 2
	tail := make([]byte, keep)
	if _, err := f.ReadAt(tail, st.Size()-keep); err != nil && err != io.EOF {
		return 0, fmt.Errorf("read log tail: %w", err)
	}
	if err := f.Truncate(0); err != nil {
		return 0, fmt.Errorf("truncate log: %w", err)
	}
	dropped := st.Size() - keep
	head := fmt.Sprintf("[agentvm %s] log trimmed: %d older bytes dropped (the log keeps at most %d)\n",
		time.Now().UTC().Format(time.RFC3339Nano), dropped, max)
	// Writes go to offset 0 onwards: the file is empty unless QEMU appended
	// meanwhile, and WriteAt would then overwrite that; append instead.
	af, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return dropped, err
	}
	defer af.Close()
	if _, err := af.Write(append([]byte(head), tail...)); err != nil {
		return dropped, fmt.Errorf("write log tail: %w", err)
	}
	return dropped, nil
}
