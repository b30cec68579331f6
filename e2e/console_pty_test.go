package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/e2e/testenv"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair (master, slave).
func openPTY() (*os.File, *os.File, error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	sl, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	unix.IoctlSetWinsize(int(sl.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 40, Col: 120})
	return m, sl, nil
}

// cliEcho runs `agentvm term VM --session NAME` on a PTY (as a user's
// terminal would) and measures n keystrokes: a byte written to the PTY until
// it comes back (bench/access.go's loop), in ms, after 5 warm-up bytes.
func cliEcho(s *testenv.Server, vm, session string, n int) ([]float64, error) {
	m, sl, err := openPTY()
	if err != nil {
		return nil, err
	}
	defer m.Close()
	cmd := s.CLICmd("", "term", vm, "--session", session)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = sl, sl, sl
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		sl.Close()
		return nil, err
	}
	sl.Close()
	defer func() {
		m.Write([]byte{0x1d}) // Ctrl-]: detach
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	// The reader ends when the PTY does (the deferred Close, or the CLI
	// gone), or as soon as this function returns: it never blocks on out.
	out := make(chan string, 64)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(out)
		b := make([]byte, 4096)
		for {
			k, err := m.Read(b)
			if k > 0 {
				select {
				case out <- string(b[:k]):
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	wait := func(c byte, d time.Duration) error {
		t := time.After(d)
		for {
			select {
			case s, ok := <-out:
				if !ok {
					return fmt.Errorf("agentvm term ended")
				}
				if strings.IndexByte(s, c) >= 0 {
					return nil
				}
			case <-t:
				return fmt.Errorf("no echo of %q in %s", c, d)
			}
		}
	}
	// Attached once the CLI has put its terminal in raw mode (before that
	// the PTY itself echoes) and a first byte comes back from the VM.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tio, err := unix.IoctlGetTermios(int(m.Fd()), unix.TCGETS)
		if err == nil && tio.Lflag&unix.ECHO == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agentvm term never put its terminal in raw mode")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		m.Write([]byte{'Z'})
		if wait('Z', 2*time.Second) == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("agentvm term never echoed")
		}
	}
	var ds []float64
	for i := 0; i < n; i++ {
		c := byte('a' + i%25)
		t0 := time.Now()
		if _, err := m.Write([]byte{c}); err != nil {
			return nil, err
		}
		if err := wait(c, time.Minute); err != nil {
			return nil, err
		}
		if i >= 5 {
			ds = append(ds, float64(time.Since(t0).Microseconds())/1000)
		}
	}
	return ds, nil
}
