package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// saveSink is where an outgoing migration goes: a file (the stream format),
// a pipe read by SplitState (the page format), or a file QEMU opens itself
// (FormatMapped).
type saveSink struct {
	args map[string]any // the migrate command's
	// finish ends the sink once QEMU is done with the migration (migErr is
	// how it ended) and returns the save's error.
	finish func(migErr error) error
}

// openSink makes ready a save to path in format: QEMU gets the file itself
// (a stream); or, for FormatPages, a pipe whose other end the splitter reads
// into path (with the page-format header) and a new RAM file at
// path+RAMSuffix; or, for FormatMapped, the file's name, with mapped-ram
// and multifd on until the save ends (turned off then at best: QEMU refuses
// while a cancelled save winds down, and every save turns them off first).
func (m *Machine) openSink(ctx context.Context, path, format string) (*saveSink, error) {
	switch format {
	case FormatMapped:
		if err := m.setMappedRAM(ctx, true, true); err != nil {
			return nil, err
		}
		return &saveSink{args: map[string]any{"channels": fileChannel(path)}, finish: func(err error) error {
			m.setMappedRAM(context.Background(), false, false)
			return err
		}}, nil
	case FormatStream:
		uri, err := m.passFile(ctx, path, true)
		return &saveSink{args: map[string]any{"uri": uri}, finish: func(err error) error { return err }}, err
	}
	ramPath := path + RAMSuffix
	ramSize := m.cfg.MemoryMiB << 20
	// Every save writes a new RAM file (a new inode): a QEMU restored from
	// an older one maps it privately and would see any change made to it.
	os.Remove(ramPath)
	ram, err := os.OpenFile(ramPath, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	state, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		ram.Close()
		os.Remove(ramPath)
		return nil, err
	}
	fail := func(err error) (*saveSink, error) {
		state.Close()
		ram.Close()
		os.Remove(ramPath)
		return nil, err
	}
	if _, err := state.Write(pagesHeader(ramSize, SplitStats{})); err != nil {
		return fail(err)
	}
	// QEMU gets a blocking write end: os.Pipe makes both ends
	// non-blocking, and QEMU 7.2's migration thread then waits for every
	// EAGAIN in a main loop of its own, which made saves several times
	// slower. The read end is non-blocking for Go's poller, so that
	// closing it stops the splitter.
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return fail(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fail(err)
	}
	pr, pw := os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1")
	unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, 1<<20) // best effort
	name := "mig" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err = m.qmp.ExecuteWithFD(ctx, "getfd", map[string]any{"fdname": name}, int(pw.Fd()))
	pw.Close() // QEMU has its own copy; its close is the splitter's end of input
	if err != nil {
		pr.Close()
		return fail(err)
	}
	type result struct {
		stats SplitStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := SplitState(pr, state, ram, ramSize)
		pr.Close() // a splitter that gave up makes QEMU's writes fail: the migration ends
		if err == nil {
			// The header learns where the pages may go back (writeEager).
			_, err = state.WriteAt(pagesHeader(ramSize, st), 0)
		}
		if cerr := state.Close(); err == nil {
			err = cerr
		}
		if cerr := ram.Close(); err == nil {
			err = cerr
		}
		done <- result{st, err}
	}()
	finish := func(migErr error) error {
		if migErr != nil {
			// QEMU may still hold the pipe (a migrate that never started):
			// closing the read end stops the splitter either way.
			pr.Close()
		}
		var r result
		waitStart := time.Now()
		defer func() {
			m.logSave("page format save: %d pages to the RAM file, %d zero pages, %d bytes of state; the split ended %d ms after QEMU's migration",
				r.stats.Pages, r.stats.ZeroPages, r.stats.StateBytes, time.Since(waitStart).Milliseconds())
		}()
		select {
		case r = <-done:
		case <-time.After(time.Minute): // QEMU closes the pipe when the migration ends
			pr.Close()
			r = <-done
			if r.err == nil {
				r.err = errors.New("the migration stream did not end")
			}
		}
		err := migErr
		ownFault := r.err != nil && !errors.Is(r.err, errTruncated) && !errors.Is(r.err, os.ErrClosed)
		if r.err != nil && (err == nil || ownFault) {
			// A splitter that failed on its own (a stream it does not know,
			// a full disk) comes first: QEMU only saw a broken pipe.
			err = fmt.Errorf("page format: %w", r.err)
		}
		if err != nil {
			os.Remove(ramPath)
		}
		return err
	}
	return &saveSink{args: map[string]any{"uri": "fd:" + name}, finish: finish}, nil
}

// pagesFor says whether a save of this machine's own memory uses the page
// format: asked for, and the memory is the machine's own (a template
// shares its RAM file instead).
func (m *Machine) pagesFor(ignoreShared bool, format string) bool {
	return format == FormatPages && !ignoreShared && m.cfg.MemoryMiB > 0
}
