package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
)

// forwarder is a local TCP listener whose every connection is tunnelled to a port
// inside the VM through the daemon (client.DialTCP, Upgrade: agentvm-tcp).
type forwarder struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[io.Closer]struct{}
	errs   int
	lastEr error
}

func (b *bench) startForwarder(ctx context.Context, vm string, port int) (*forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, conns: map[io.Closer]struct{}{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(ctx, c, b, vm, port)
			}()
		}
	}()
	return f, nil
}

func (f *forwarder) serve(ctx context.Context, c net.Conn, b *bench, vm string, port int) {
	defer c.Close()
	g, err := b.c.DialTCP(ctx, vm, port)
	if err != nil {
		f.mu.Lock()
		f.errs++
		f.lastEr = err
		f.mu.Unlock()
		return
	}
	f.mu.Lock()
	f.conns[g] = struct{}{}
	f.conns[c] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.conns, g)
		delete(f.conns, c)
		f.mu.Unlock()
		g.Close()
	}()
	done := make(chan struct{})
	go func() {
		io.Copy(g, c) // local -> VM; the tunnel has no half-close, so EOF ends both
		g.Close()
		close(done)
	}()
	io.Copy(c, g)
	c.Close()
	<-done
}

func (f *forwarder) port() int { return f.ln.Addr().(*net.TCPAddr).Port }

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *forwarder) dialErrors() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs, f.lastEr
}

// installSSHD installs and starts OpenSSH's sshd in the VM with a fresh key
// for root, and returns the key file and a local forwarder to port 22.
func (b *bench) installSSHD(ctx context.Context, vm string) (string, *forwarder, error) {
	s := &b.r.SSH
	dir := filepath.Join(b.tmp, "ssh")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	key := filepath.Join(dir, "id_ed25519")
	if _, err := os.Stat(key); err != nil {
		if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "agentvm-bench",
			"-f", key).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return "", nil, err
	}

	logf("installing openssh-server in %s (apt-get; takes a while under TCG)", vm)
	t0 := time.Now()
	ictx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	res, err := b.c.Exec(ictx, vm, api.ExecRequest{
		Shell: "apt-get update -q && apt-get install -y -q --no-install-recommends openssh-server",
		Env:   map[string]string{"DEBIAN_FRONTEND": "noninteractive"}, Timeout: api.Duration(14 * time.Minute)})
	cancel()
	if err != nil {
		return "", nil, fmt.Errorf("apt-get install openssh-server: %w", err)
	}
	if res.ExitCode != 0 || res.TimedOut {
		return "", nil, fmt.Errorf("apt-get install openssh-server exited %d (timed out %v): %s", res.ExitCode, res.TimedOut,
			tailStr(res.Stdout+res.Stderr, 1500))
	}
	s.InstallSeconds = time.Since(t0).Seconds()
	logf("openssh-server installed in %.0f s", s.InstallSeconds)

	res, err = b.c.Exec(ctx, vm, api.ExecRequest{
		Shell: "set -e; install -d -m 700 /root/.ssh; cat > /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys; " +
			"systemctl start ssh; systemctl is-active ssh",
		Stdin: string(pub), Timeout: api.Duration(2 * time.Minute)})
	if err != nil {
		return "", nil, fmt.Errorf("install key / start sshd: %w", err)
	}
	if res.ExitCode != 0 {
		return "", nil, fmt.Errorf("install key / start sshd exited %d: %s", res.ExitCode, tailStr(res.Stdout+res.Stderr, 1500))
	}
	fwd, err := b.startForwarder(ctx, vm, 22)
	if err != nil {
		return "", nil, err
	}
	return key, fwd, nil
}

// sshBench installs OpenSSH in the VM and measures `ssh ... true` with a new
// connection per call and over a ControlMaster connection.
func (b *bench) sshBench(ctx context.Context, vm string) error {
	s := &b.r.SSH
	dir := filepath.Join(b.tmp, "ssh")
	key, fwd, err := b.installSSHD(ctx, vm)
	if err != nil {
		return err
	}
	cm := filepath.Join(dir, "cm")
	base := []string{"-i", key, "-p", strconv.Itoa(fwd.port()), "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=60"}
	cmOpts := []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + cm, "-o", "ControlPersist=60"}
	masterStarted := false
	b.sshCleanup = func() {
		if masterStarted {
			args := append(append(append([]string{}, base...), cmOpts...), "-O", "exit", "root@127.0.0.1")
			ectx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			out, err := sshRun(ectx, dir, args)
			cancel()
			if err != nil && !strings.Contains(out, "No such file") {
				logf("ssh -O exit: %v: %s", err, strings.TrimSpace(out))
			}
		}
		fwd.close()
	}
	defer func() {
		if b.sshCleanup != nil {
			b.sshCleanup()
			b.sshCleanup = nil
		}
	}()

	sshTrue := func(extra []string) func() error {
		args := append(append(append([]string{}, base...), extra...), "root@127.0.0.1", "true")
		return func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			out, err := sshRun(cctx, dir, args)
			if err != nil {
				n, derr := fwd.dialErrors()
				return fmt.Errorf("ssh: %v: %s (tunnel dial errors: %d, last: %v)", err, strings.TrimSpace(out), n, derr)
			}
			return nil
		}
	}
	newConn := sshTrue(nil)
	// sshd may need a moment after systemctl start: retry the first connection.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := newConn()
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("first ssh connection: %w", err)
		}
		time.Sleep(time.Second)
	}
	// The tunnel alone: DialTCP to port 22 until sshd's version banner arrives.
	banner := func() error {
		g, err := b.c.DialTCP(ctx, vm, 22)
		if err != nil {
			return err
		}
		defer g.Close()
		buf := make([]byte, 256)
		n, err := g.Read(buf)
		if n > 0 && strings.HasPrefix(string(buf[:n]), "SSH-") {
			return nil
		}
		return fmt.Errorf("no ssh banner (read %q: %v)", buf[:n], err)
	}
	if s.TunnelBanner, err = timeLoop(ctx, "DialTCP to ssh banner", 1, b.o.sshNew, banner); err != nil {
		return err
	}
	if s.New, err = timeLoop(ctx, "ssh (new connection)", 1, b.o.sshNew, newConn); err != nil {
		return err
	}

	// Open the master once (not timed), then time calls multiplexed over it.
	masterStarted = true
	t1 := time.Now()
	if err := sshTrue(cmOpts)(); err != nil {
		return fmt.Errorf("open ControlMaster: %w", err)
	}
	s.MasterOpenMs = msf(time.Since(t1))
	if _, err := os.Stat(cm); err != nil {
		return fmt.Errorf("ControlMaster socket %s missing after the first call: %w", cm, err)
	}
	if s.ControlMaster, err = timeLoop(ctx, "ssh (ControlMaster)", 2, b.o.sshCM, sshTrue(cmOpts)); err != nil {
		return err
	}
	n, _ := fwd.dialErrors()
	s.TunnelDialErrors = n
	return nil
}

// sshRun runs ssh with stdin from /dev/null and output to a file, not a pipe: the
// ControlPersist master forks into the background holding ssh's stdout/stderr, and
// a pipe would make Wait block until the master exits.
func sshRun(ctx context.Context, dir string, args []string) (string, error) {
	f, err := os.CreateTemp(dir, "ssh-out-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}

func tailStr(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
