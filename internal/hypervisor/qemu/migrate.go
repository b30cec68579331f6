package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Pause freezes the vCPUs; memory stays in RAM.
func (m *Machine) Pause(ctx context.Context) error {
	_, err := m.qmp.Execute(ctx, "stop", nil)
	return err
}

// Resume continues a paused guest.
func (m *Machine) Resume(ctx context.Context) error {
	_, err := m.qmp.Execute(ctx, "cont", nil)
	return err
}

// SaveResult describes a state save.
type SaveResult struct {
	// Paused is how long the guest's vCPUs were stopped by the save (live saves only;
	// for a stopped save it is the whole save).
	Paused time.Duration
	// Bytes is the size of the migration stream (RAM and device state).
	Bytes int64
	// Total is the whole save, precopy included.
	Total time.Duration
	// Format is how the state was written: FormatStream, FormatPages
	// (then the guest's RAM is in <path>.ram) or FormatMapped.
	Format string
}

// SaveLive writes the guest's RAM and device state to path while it keeps running
// (precopy). When the stream completes, QEMU leaves the guest stopped; atStop then
// runs (for example to freeze the disk at exactly this point) before the guest is
// resumed. The pause is measured from QEMU's STOP event to the end of `cont`.
//
// Under TCG the save is stop-and-copy instead (see precopyUnreliable): the
// guest is paused for the whole save, but the state is exact.
func (m *Machine) SaveLive(ctx context.Context, path, format string, atStop func() error) (SaveResult, error) {
	if m.precopyUnreliable(ctx) || m.precopyAbortsOnPlugged(ctx) {
		return m.saveStoppedAndResume(ctx, path, format, atStop)
	}
	if !m.pagesFor(false, format) {
		format = FormatStream // mapped-ram is for stopped saves (suspends)
	}
	res, err := m.saveLive(ctx, path, atStop, format)
	if format == FormatPages && errors.Is(err, ErrUnsupportedStream) && ctx.Err() == nil {
		m.logSave("live save: %v; saving again as a plain stream", err)
		res, err = m.saveLive(ctx, path, atStop, FormatStream)
	}
	return res, err
}

func (m *Machine) saveLive(ctx context.Context, path string, atStop func() error, format string) (_ SaveResult, err error) {
	defer func() { err = m.exitedDuringSave(err) }()
	stopped := make(chan time.Time, 1)
	defer m.OnEvent(func(e Event) {
		if e.Event == "STOP" {
			select {
			case stopped <- time.Now():
			default:
			}
		}
	})() // removed when the save is over: each save used to leave one behind
	if err := m.setFileMigration(ctx, false, 50); err != nil {
		return SaveResult{}, err
	}
	start := time.Now()
	sink, err := m.openSink(ctx, path, format)
	if err != nil {
		return SaveResult{}, err
	}
	if _, err := m.qmp.Execute(ctx, "migrate", sink.args); err != nil {
		return SaveResult{}, sink.finish(err)
	}
	bytes, err := m.waitMigration(ctx, true)
	err = sink.finish(err)
	var stopAt time.Time
	select {
	case stopAt = <-stopped:
	case <-time.After(2 * time.Second):
		stopAt = time.Now()
	}
	if err == nil && atStop != nil {
		err = atStop()
	}
	if err != nil {
		discardPartial(path)
	}
	// Always resume the source, even when the save failed.
	if _, cerr := m.qmp.Execute(context.Background(), "cont", nil); cerr != nil && err == nil {
		err = cerr
	}
	return SaveResult{Paused: time.Since(stopAt), Bytes: bytes, Total: time.Since(start), Format: format}, err
}

// logSave notes a save's fallback in the VM's log.
func (m *Machine) logSave(format string, a ...any) {
	if f, err := os.OpenFile(m.cfg.LogPath, os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "[agentvm] "+format+"\n", a...)
		f.Close()
	}
}

// precopyUnreliable reports whether a live (precopy) save can lose guest
// writes with this accelerator. QEMU before 9.0 does not reset TCG's TLB when
// a migration dirty-bitmap sync clears a page's bit (the 64-page fast path of
// cpu_physical_memory_sync_dirty_bitmap; fixed upstream by "physmem: Fix
// migration dirty bitmap coherency with TCG memory access"), so a vCPU that
// keeps a page in its TLB writes it without marking it dirty again: the last
// copy in the stream is stale. A busy guest's kernel stacks are such pages,
// and its forks came up with an oops (a return to address 0) or rebooted on
// the panic. With KVM the kernel tracks dirty pages and precopy is exact.
func precopyUnreliable(accel, version string) bool {
	return accel == "tcg" && !atLeast(version, 9, 0)
}

// precopyUnreliable asks the running QEMU its version (the binary on disk
// may have been upgraded since it started); a QEMU that does not say is
// taken to be affected.
func (m *Machine) precopyUnreliable(ctx context.Context) bool {
	if m.cfg.Accel != "tcg" {
		return false
	}
	v, err := m.Version(ctx)
	return err != nil || precopyUnreliable(m.cfg.Accel, v)
}

// Version is the running QEMU's version ("10.0.2"), asked once.
func (m *Machine) Version(ctx context.Context) (string, error) {
	m.mu.Lock()
	v := m.version
	m.mu.Unlock()
	if v != "" {
		return v, nil
	}
	r, err := m.qmp.Execute(ctx, "query-version", nil)
	if err != nil {
		return "", err
	}
	var q struct {
		QEMU struct {
			Major, Minor, Micro int
		} `json:"qemu"`
	}
	if err := json.Unmarshal(r, &q); err != nil {
		return "", fmt.Errorf("query-version: %w", err)
	}
	v = fmt.Sprintf("%d.%d.%d", q.QEMU.Major, q.QEMU.Minor, q.QEMU.Micro)
	m.mu.Lock()
	m.version = v
	m.mu.Unlock()
	return v, nil
}

// atLeast reports whether version ("9.2.1") is at least major.minor.
func atLeast(version string, major, minor int) bool {
	var maj, min int
	if _, err := fmt.Sscanf(version, "%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj > major || maj == major && min >= minor
}

// saveStoppedAndResume is SaveLive as stop-and-copy: the guest is stopped,
// its whole state written, atStop run and the guest resumed (also when the
// save failed). Paused covers the whole save.
func (m *Machine) saveStoppedAndResume(ctx context.Context, path, format string, atStop func() error) (SaveResult, error) {
	start := time.Now()
	res, err := m.saveStopped(ctx, path, false, format)
	if err == nil && atStop != nil {
		err = atStop()
	}
	// cont is harmless if the stop never happened.
	if _, cerr := m.qmp.Execute(context.Background(), "cont", nil); cerr != nil && err == nil {
		err = m.exitedDuringSave(cerr)
	}
	res.Paused, res.Total = time.Since(start), time.Since(start)
	return res, err
}

// SaveStopped pauses the guest and writes its RAM and device state to path in
// format (FormatStream, FormatPages, or FormatMapped where QEMU has it, else
// a stream); the guest is left paused (the caller
// quits QEMU for a suspend, or resumes it).
func (m *Machine) SaveStopped(ctx context.Context, path, format string) (SaveResult, error) {
	return m.saveStopped(ctx, path, false, format)
}

func (m *Machine) saveStopped(ctx context.Context, path string, ignoreShared bool, format string) (SaveResult, error) {
	switch {
	case format == FormatMapped && (ignoreShared || !m.MappedRAM(ctx)),
		format == FormatPages && !m.pagesFor(ignoreShared, format):
		format = FormatStream
	}
	res, err := m.saveStoppedAs(ctx, path, ignoreShared, format)
	if err != nil && ctx.Err() == nil && fallsBackToStream(format, err) {
		m.logSave("%s save: %v; saving again as a plain stream", format, err)
		// A migration that completed left QEMU in postmigrate, where it
		// refuses another: back to a plain pause first.
		if err := m.Repause(ctx); err != nil {
			return res, err
		}
		res, err = m.saveStoppedAs(ctx, path, ignoreShared, FormatStream)
	}
	return res, err
}

// fallsBackToStream says whether a save in format that failed with err is
// tried again as a plain stream: a page-format save whose stream the
// splitter does not know, and a mapped-ram save that failed while QEMU
// lives and the disk has room.
func fallsBackToStream(format string, err error) bool {
	switch format {
	case FormatPages:
		return errors.Is(err, ErrUnsupportedStream)
	case FormatMapped:
		return !errors.Is(err, ErrExitedDuringSave) && !strings.Contains(err.Error(), "No space left")
	}
	return false
}

func (m *Machine) saveStoppedAs(ctx context.Context, path string, ignoreShared bool, format string) (_ SaveResult, err error) {
	defer func() {
		if err != nil {
			discardPartial(path)
		}
		err = m.exitedDuringSave(err)
	}()
	start := time.Now()
	if err := m.setFileMigration(ctx, ignoreShared, 0); err != nil {
		return SaveResult{}, err
	}
	sink, err := m.openSink(ctx, path, format)
	if err != nil {
		return SaveResult{}, err
	}
	if _, err := m.qmp.Execute(ctx, "stop", nil); err != nil {
		return SaveResult{}, sink.finish(err)
	}
	if _, err := m.qmp.Execute(ctx, "migrate", sink.args); err != nil {
		return SaveResult{}, sink.finish(err)
	}
	bytes, err := m.waitMigration(ctx, false)
	err = sink.finish(err)
	return SaveResult{Paused: time.Since(start), Bytes: bytes, Total: time.Since(start), Format: format}, err
}

// discardPartial empties the file of a failed save before the guest may run
// again. QEMU may still hold it open for a moment after it reports the
// failure, so removing it would not give its blocks back yet; on a full disk
// those blocks are what the guests' disk writes need (QEMU stops a guest whose
// write finds no space). The caller removes the empty file.
func discardPartial(path string) {
	os.Truncate(path, 0)
	os.Remove(path + RAMSuffix) // only the daemon ever had it open
}

// ExitedDuringSave is exitedDuringSave for callers that saw a save fail.
func (m *Machine) ExitedDuringSave(err error) error { return m.exitedDuringSave(err) }

// exitedDuringSave turns the error of a save whose QEMU died under it (a QMP
// command that found the connection closed) into one that says so.
func (m *Machine) exitedDuringSave(err error) error {
	if err == nil || errors.Is(err, ErrExitedDuringSave) {
		return err
	}
	if !m.qmpGone() {
		return err // QEMU is still there: the error is its own
	}
	select {
	case <-m.done:
	case <-time.After(2 * time.Second): // QMP closes a moment before the exit is reaped
		return err
	}
	if st := m.ExitStatus(); st != "" {
		return fmt.Errorf("%w (%s)", ErrExitedDuringSave, st)
	}
	return ErrExitedDuringSave
}

// ErrExitedDuringSave: QEMU exited while it was saving the guest's state.
var ErrExitedDuringSave = errors.New("qemu exited during the save")

// setFileMigration prepares a migration to a local file: RAM included unless
// ignoreShared, no bandwidth cap (QEMU's default is 128 MiB/s).
func (m *Machine) setFileMigration(ctx context.Context, ignoreShared bool, downtimeMs int) error {
	if err := m.setIgnoreShared(ctx, ignoreShared); err != nil {
		return err
	}
	// A mapped-ram save or restore this process did not see end (a
	// daemon killed in between, a cancelled save whose turn-off QEMU
	// refused) may have left mapped-ram and multifd on: every save here
	// writes through a descriptor or a pipe, which they cannot.
	if err := m.setMappedRAM(ctx, false, false); err != nil {
		return err
	}
	p := map[string]any{"max-bandwidth": int64(64) << 30}
	if downtimeMs > 0 {
		p["downtime-limit"] = downtimeMs
	}
	_, err := m.qmp.Execute(ctx, "migrate-set-parameters", p)
	return err
}

// convergeSyncs bounds the passes of a live save over the memory the guest
// dirtied during the previous one. A guest that dirties memory faster than
// the save writes it never leaves so few dirty pages that the rest fits in
// the downtime limit, and the save would run until its caller gave up.
// When QEMU has synced the dirty bitmap this many times (once at the start,
// then about once per pass; a guest that slows down enough needs two or
// three) the downtime limit is raised to QEMU's maximum: QEMU stops the
// guest and writes the rest, a longer pause instead of a fork that never
// happens.
const convergeSyncs = 8

// maxDowntimeMs is QEMU's upper bound for downtime-limit.
const maxDowntimeMs = 2_000_000

// waitMigration polls until the outgoing migration ends and returns the
// bytes sent. A live save that has not converged by convergeSyncs syncs
// is made to finish (see convergeSyncs).
func (m *Machine) waitMigration(ctx context.Context, live bool) (int64, error) {
	forced := false
	for {
		r, err := m.qmp.Execute(ctx, "query-migrate", nil)
		if err != nil {
			return 0, err
		}
		var s struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
			RAM       struct {
				Total       int64 `json:"total"`
				Transferred int64 `json:"transferred"`
				Syncs       int64 `json:"dirty-sync-count"`
			} `json:"ram"`
		}
		json.Unmarshal(r, &s)
		switch s.Status {
		case "completed":
			return s.RAM.Transferred, nil
		case "failed", "cancelled":
			return 0, fmt.Errorf("migration %s: %s", s.Status, s.ErrorDesc)
		}
		if live && !forced && s.RAM.Syncs >= convergeSyncs {
			forced = true
			m.logSave("live save: the guest still dirtied memory faster than it was written after %d dirty-bitmap syncs (%d MiB written); stopping it for the rest", s.RAM.Syncs, s.RAM.Transferred>>20)
			if _, err := m.qmp.Execute(ctx, "migrate-set-parameters", map[string]any{"downtime-limit": maxDowntimeMs}); err != nil {
				m.logSave("live save: raising the downtime limit: %v", err) // it goes on as it was
			}
		}
		select {
		case <-ctx.Done():
			m.qmp.Execute(context.Background(), "migrate_cancel", nil)
			return 0, ctx.Err()
		case <-m.done:
			return 0, fmt.Errorf("qemu exited during the save")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// EndOutgoingMigration cancels an outgoing migration that a previous owner
// of this QEMU started and did not see through (a daemon killed during a
// save), and waits until QEMU has left it: cancelled, failed or completed.
// A save that completed leaves the guest stopped ("postmigrate"); the caller
// puts it back in the state it wants.
func (m *Machine) EndOutgoingMigration(ctx context.Context) error {
	if _, err := m.qmp.Execute(ctx, "migrate_cancel", nil); err != nil {
		return err
	}
	for {
		r, err := m.qmp.Execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var s struct {
			Status string `json:"status"`
		}
		json.Unmarshal(r, &s)
		switch s.Status {
		case "", "none", "completed", "failed", "cancelled":
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration still %s: %w", s.Status, ctx.Err())
		case <-m.done:
			return fmt.Errorf("qemu exited")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Flatten copies the data of every layer above base into the disk's top
// (block-stream) and waits for the job; the top's backing file becomes base.
func (m *Machine) Flatten(ctx context.Context, base string) error {
	job := "flatten" + fmt.Sprint(time.Now().UnixNano())
	if _, err := m.qmp.Execute(ctx, "block-stream", map[string]any{"job-id": job, "device": "disk0", "base": base}); err != nil {
		return err
	}
	for {
		r, err := m.qmp.Execute(ctx, "query-block-jobs", nil)
		if err != nil {
			return err
		}
		var jobs []struct {
			Device string `json:"device"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		json.Unmarshal(r, &jobs)
		running := false
		for _, j := range jobs {
			if j.Device == job {
				running = true
				if j.Error != "" {
					return fmt.Errorf("block-stream: %s", j.Error)
				}
			}
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			m.qmp.Execute(context.Background(), "block-job-cancel", map[string]any{"device": job})
			return ctx.Err()
		case <-m.done:
			return fmt.Errorf("qemu exited during block-stream")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Repause brings a guest that a completed save left stopped ("postmigrate") back to
// a plain pause: QEMU refuses any later migration from postmigrate, so the guest is
// resumed for an instant and stopped again.
func (m *Machine) Repause(ctx context.Context) error {
	if st, err := m.Status(ctx); err != nil || st != "postmigrate" {
		return err
	}
	if _, err := m.qmp.Execute(ctx, "cont", nil); err != nil {
		return err
	}
	_, err := m.qmp.Execute(ctx, "stop", nil)
	return err
}
