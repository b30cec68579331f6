package sshgw

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/record"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// sftpMarker stands for the sftp subsystem among the argv of start.
const sftpMarker = "\x00sftp"

// session is one SSH "session" channel: a shell, a command or a subsystem,
// with or without a PTY.
type session struct {
	g    *Gateway
	vmID string
	user string
	who  string // the actor, for recordings
	ch   ssh.Channel
	env  map[string]string

	mu      sync.Mutex
	pty     *ptyReq
	started bool
	term    *guest.TermStream // running with a PTY
	exec    *guest.ExecStream // running without one
	sftp    net.Conn          // the sftp subsystem
	cast    *record.Cast      // the PTY's recording
	execRec *record.ExecTap   // the command's recording
}

type ptyReq struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

func (s *session) serve(reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	done := make(chan struct{})
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				s.stop()
				return
			}
			s.handle(req, done)
		case <-done:
			// The program ended and its status was sent; drain requests
			// until the client closes the channel.
			s.ch.Close()
			for req := range reqs {
				if req.WantReply {
					req.Reply(false, nil)
				}
			}
			return
		}
	}
}

func (s *session) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sftp != nil {
		s.sftp.Close()
	}
	if s.term != nil {
		s.term.Close() // ephemeral: the agent hangs up the shell
	}
	if s.exec != nil {
		s.exec.Close() // the agent kills the process group
	}
}

func (s *session) handle(req *ssh.Request, done chan struct{}) {
	reply := func(ok bool) {
		if req.WantReply {
			req.Reply(ok, nil)
		}
	}
	switch req.Type {
	case "env":
		var kv struct{ Name, Value string }
		if ssh.Unmarshal(req.Payload, &kv) != nil || !validEnv(kv.Name, kv.Value) {
			reply(false)
			return
		}
		s.mu.Lock()
		s.env[kv.Name] = kv.Value
		s.mu.Unlock()
		reply(true)
	case "pty-req":
		var p ptyReq
		if ssh.Unmarshal(req.Payload, &p) != nil {
			reply(false)
			return
		}
		s.mu.Lock()
		s.pty = &p
		s.mu.Unlock()
		reply(true)
	case "window-change":
		var wc struct{ Cols, Rows, Width, Height uint32 }
		if ssh.Unmarshal(req.Payload, &wc) != nil {
			reply(false)
			return
		}
		s.mu.Lock()
		if s.pty != nil {
			s.pty.Cols, s.pty.Rows = wc.Cols, wc.Rows
		}
		t := s.term
		s.mu.Unlock()
		if t != nil {
			t.Resize(int(wc.Cols), int(wc.Rows))
		}
		reply(true)
	case "signal":
		var sig struct{ Name string }
		if ssh.Unmarshal(req.Payload, &sig) != nil {
			reply(false)
			return
		}
		n := unix.SignalNum("SIG" + strings.TrimPrefix(sig.Name, "SIG"))
		s.mu.Lock()
		t, e := s.term, s.exec
		s.mu.Unlock()
		switch {
		case n == 0:
			reply(false)
			return
		case t != nil:
			t.Signal(n)
		case e != nil:
			e.Signal(n)
		}
		reply(true)
	case "shell", "exec", "subsystem":
		s.mu.Lock()
		started := s.started
		s.started = true
		s.mu.Unlock()
		if started {
			reply(false)
			return
		}
		var argv []string
		switch req.Type {
		case "shell":
			// nil: the agent starts the user's login shell
		case "exec":
			var cmd struct{ Command string }
			if ssh.Unmarshal(req.Payload, &cmd) != nil {
				reply(false)
				return
			}
			// Like sshd: the user's shell runs the command string.
			argv = []string{"/bin/sh", "-c", `exec "${SHELL:-/bin/sh}" -c "$1"`, "sh", cmd.Command}
		case "subsystem":
			var sub struct{ Name string }
			if ssh.Unmarshal(req.Payload, &sub) != nil || sub.Name != "sftp" {
				reply(false)
				return
			}
			argv = []string{sftpMarker}
			s.mu.Lock()
			s.pty = nil // sftp never runs on a terminal
			s.mu.Unlock()
		}
		if err := s.start(argv); err != nil {
			s.g.log.Info("ssh session start failed", "vm", s.vmID, "user", s.user, "err", err)
			io.WriteString(s.ch.Stderr(), "agentvm: "+err.Error()+"\r\n")
			reply(false)
			close(done)
			return
		}
		reply(true)
		go func() {
			s.wait()
			close(done)
		}()
	default:
		// x11-req, auth-agent-req@openssh.com, keepalive@openssh.com, ...
		reply(false)
	}
}

func validEnv(k, v string) bool {
	if k == "" || len(k) > 256 || len(v) > 32<<10 || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
		return false
	}
	return true
}

// start launches the program: an ephemeral agent terminal when a PTY was
// requested, else an exec stream with separate stdout and stderr.
func (s *session) start(argv []string) error {
	ctx := context.Background()
	_, gc, err := s.g.cfg.VMs.Guest(ctx, s.vmID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	env := make(map[string]string, len(s.env)+1)
	for k, v := range s.env {
		env[k] = v
	}
	p := s.pty
	s.mu.Unlock()
	if len(argv) == 1 && argv[0] == sftpMarker {
		c, err := gc.SFTP(ctx, s.user)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.sftp = c
		s.mu.Unlock()
		return nil
	}
	if p != nil {
		if p.Term != "" {
			env["TERM"] = p.Term
		}
		t, err := gc.CreateTerm(ctx, guest.TermCreate{Argv: argv, Env: env, User: s.user, Cols: int(p.Cols), Rows: int(p.Rows), Ephemeral: true})
		if err != nil {
			return err
		}
		st, err := gc.AttachTerm(ctx, t.Name, guest.TermAttach{NoScrollback: false})
		if err != nil {
			gc.DeleteTerm(ctx, t.Name)
			return err
		}
		var cast *record.Cast
		if s.g.cfg.Record != nil {
			if cast = s.g.cfg.Record.Terminal(s.vmID, "ssh", s.user, s.who, int(p.Cols), int(p.Rows)); cast != nil {
				st.Tap = cast
			}
		}
		s.mu.Lock()
		s.term, s.cast = st, cast
		s.mu.Unlock()
		return nil
	}
	if argv == nil {
		argv = []string{"/bin/sh", "-c", `exec "${SHELL:-/bin/sh}" -l`}
	}
	st, err := gc.Exec(ctx, guest.ExecRequest{Argv: argv, Env: env, User: s.user, Stdin: true})
	if err != nil {
		return err
	}
	var rec *record.ExecTap
	if s.g.cfg.Record != nil {
		if rec = s.g.cfg.Record.Exec(s.vmID, record.Exec{Command: strings.Join(argv, " "), Argv: argv, User: s.user, Actor: s.who, Via: "ssh"}); rec != nil {
			st.Tap = rec
			st.OnExit = func(x guest.ExitStatus) { rec.Done(x.ExitCode, x.Signal, x.TimedOut) }
		}
	}
	s.mu.Lock()
	s.exec, s.execRec = st, rec
	s.mu.Unlock()
	return nil
}

// wait relays data until the program exits, then sends its exit status.
func (s *session) wait() {
	s.mu.Lock()
	t, e, sc, cast, rec := s.term, s.exec, s.sftp, s.cast, s.execRec
	s.mu.Unlock()
	defer cast.Close()
	defer rec.Done(-1, "", false) // a stream lost before its exit
	var st *guest.ExitStatus
	if sc != nil {
		go func() {
			copyCoalesced(sc, s.ch)
			if cw, ok := sc.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite() // the client is done: the server ends after its last answers
			}
		}()
		_, err := copyBuf(s.ch, sc)
		sc.Close()
		st = &guest.ExitStatus{}
		if err != nil {
			st.ExitCode = 1
		}
	} else if t != nil {
		go func() {
			copyCoalesced(t, s.ch)
		}()
		for {
			f, err := t.Next()
			if err != nil {
				break
			}
			if f.Type == api.FrameStdout {
				if _, err := s.ch.Write(f.Data); err != nil {
					break
				}
			} else if f.Type == api.FrameExit {
				st = new(guest.ExitStatus)
				json.Unmarshal(f.Data, st)
				break
			}
		}
		t.Close()
	} else {
		go func() {
			if _, err := copyCoalesced(e, s.ch); err == nil {
				e.CloseStdin()
			}
		}()
		var err error
		st, err = e.Wait(s.ch, s.ch.Stderr())
		if err != nil && st == nil {
			io.WriteString(s.ch.Stderr(), "agentvm: "+err.Error()+"\n")
		} else if err != nil {
			io.WriteString(s.ch.Stderr(), err.Error()+"\n")
		}
		e.Close()
	}
	s.ch.CloseWrite()
	if st == nil {
		s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{255}))
		return
	}
	if st.Signal != "" {
		s.ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Msg, Lang  string
		}{strings.TrimPrefix(st.Signal, "SIG"), false, "", ""}))
		return
	}
	s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(st.ExitCode)}))
}

// copyBuf copies with a buffer large enough for file transfers.
func copyBuf(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(dst, src, make([]byte, 256<<10))
}

// copyCoalesced copies src to dst like io.Copy, but whatever has arrived
// while the previous write was in flight leaves as one write of up to
// 256 KiB. An SSH channel reads in packets of at most 32 KiB; each write to
// an exec or terminal stream is a frame the guest's emulated CPU must
// parse and hand on, so bulk uploads (rsync, cat > file) go faster in big
// frames, while a lone keystroke still leaves at once.
func copyCoalesced(dst io.Writer, src io.Reader) (int64, error) {
	type chunk struct {
		b   []byte
		err error
	}
	ch := make(chan chunk, 16)
	go func() {
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				ch <- chunk{b: b[:n]}
			}
			if err != nil {
				ch <- chunk{err: err}
				close(ch)
				return
			}
		}
	}()
	var total int64
	out := make([]byte, 0, 256<<10)
	for c := range ch {
		if c.err != nil {
			if c.err == io.EOF {
				return total, nil
			}
			return total, c.err
		}
		out = append(out[:0], c.b...)
		var pending *chunk
	more:
		for len(out) < 224<<10 {
			select {
			case c2, ok := <-ch:
				if !ok {
					break more
				}
				if c2.err != nil {
					pending = &c2
					break more
				}
				out = append(out, c2.b...)
			default:
				break more
			}
		}
		n, err := dst.Write(out)
		total += int64(n)
		if err != nil {
			go func() { // let the reader finish
				for range ch {
				}
			}()
			return total, err
		}
		if pending != nil {
			if pending.err == io.EOF {
				return total, nil
			}
			return total, pending.err
		}
	}
	return total, nil
}
