package agent

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/agentvm/agentvm/internal/guest"

	"github.com/pkg/sftp"
)

// sftpMaxTxPacket lets clients that ask for big reads (up to the 256 KiB
// SFTP message limit) get them in one packet; 32 KiB clients are unaffected.
const sftpMaxTxPacket = 256<<10 - 1024

// ServeSFTP serves the SFTP protocol (the sftp-server subsystem) on r and w
// with the calling process's credentials until the client disconnects (EOF
// on r); relative paths are relative to workDir. w is closed on return.
func ServeSFTP(r io.Reader, w io.WriteCloser, workDir string) error {
	aw := newAsyncWriter(w, 1<<20)
	rw := struct {
		io.Reader
		io.WriteCloser
	}{bufio.NewReaderSize(r, 256<<10), aw}
	srv, err := sftp.NewServer(rw,
		sftp.WithServerWorkingDirectory(workDir),
		sftp.WithMaxTxPacket(sftpMaxTxPacket),
	)
	if err != nil {
		aw.Close()
		return err
	}
	err = srv.Serve()
	aw.Close()
	return err
}

// asyncWriter decouples the SFTP workers from the output pipe: writes are
// appended to a buffer that one goroutine drains, so a packet's header and
// payload (two writes in pkg/sftp) and packets answered meanwhile leave in
// one write instead of many small ones.
type asyncWriter struct {
	w     io.WriteCloser
	limit int

	mu     sync.Mutex
	cond   sync.Cond
	buf    []byte
	spare  []byte
	closed bool
	err    error

	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

func newAsyncWriter(w io.WriteCloser, limit int) *asyncWriter {
	a := &asyncWriter{w: w, limit: limit, done: make(chan struct{})}
	a.cond.L = &a.mu
	go a.loop()
	return a
}

func (a *asyncWriter) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.err == nil && !a.closed && len(a.buf) >= a.limit {
		a.cond.Wait()
	}
	if a.err != nil {
		return 0, a.err
	}
	if a.closed {
		return 0, io.ErrClosedPipe
	}
	a.buf = append(a.buf, p...)
	a.cond.Broadcast()
	return len(p), nil
}

func (a *asyncWriter) loop() {
	defer close(a.done)
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		for len(a.buf) == 0 && !a.closed {
			a.cond.Wait()
		}
		if len(a.buf) == 0 {
			return // closed and drained
		}
		out := a.buf
		a.buf = a.spare[:0]
		a.cond.Broadcast() // room for blocked writers
		a.mu.Unlock()
		_, err := a.w.Write(out)
		a.mu.Lock()
		a.spare = out[:0]
		if err != nil {
			a.err = err
			a.buf = nil
			a.cond.Broadcast()
			return
		}
	}
}

// Close flushes what is buffered and closes the underlying writer.
func (a *asyncWriter) Close() error {
	a.closeOnce.Do(func() {
		a.mu.Lock()
		a.closed = true
		a.cond.Broadcast()
		a.mu.Unlock()
		<-a.done
		a.closeErr = a.w.Close()
		if a.err != nil {
			a.closeErr = a.err
		}
	})
	return a.closeErr
}

// handleSFTP serves POST /v1/sftp (see guest.PathSFTP) inside the agent:
// no process, no pipes, so the data is copied once less on each side
// (every guest-kernel copy is emulated under TCG). Root's sessions use
// pkg/sftp's file server directly; other users' sessions run every path
// operation with their file-system credentials (ServeSFTPAs).
func (a *Agent) handleSFTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.SFTPUpgrade) {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, "sftp needs Upgrade: "+guest.SFTPUpgrade)
		return
	}
	u, err := a.users.lookup(r.URL.Query().Get("user"))
	if err != nil {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, err.Error())
		return
	}
	home := "/"
	if err := asUser(u, func() error {
		fi, err := os.Stat(u.Home)
		if err == nil && fi.IsDir() {
			home = u.Home
		}
		return nil
	}); err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	conn, br, ok := switchProtocols(w, guest.SFTPUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	if u.UID == 0 {
		err = ServeSFTP(br, conn, home)
	} else {
		err = ServeSFTPAs(br, conn, home, u, a.users)
	}
	if err != nil && err != io.EOF {
		a.logf("sftp as %s: %v", u.Name, err)
	}
}
