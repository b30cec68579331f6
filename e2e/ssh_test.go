package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"golang.org/x/crypto/ssh"
)

// sshEnv runs the real OpenSSH tools against the gateway with a token as
// the password (fed through SSH_ASKPASS, as a user's script would).
type sshEnv struct {
	t          *testing.T
	host, port string
	dir        string
	env        []string
}

func newSSHEnv(t *testing.T, s *testenv.Server, password string) *sshEnv {
	t.Helper()
	for _, b := range []string{"ssh", "scp", "sftp", "rsync"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (scripts/setup.sh installs it)", b)
		}
	}
	host, port := s.SSHHostPort()
	dir := t.TempDir()
	askpass := filepath.Join(dir, "askpass")
	os.WriteFile(filepath.Join(dir, "pw"), []byte(password), 0o600)
	os.WriteFile(askpass, []byte("#!/bin/sh\ncat "+filepath.Join(dir, "pw")+"\n"), 0o700)
	info, _ := s.Client.SSHInfo(context.Background())
	os.WriteFile(filepath.Join(dir, "known_hosts"), []byte("["+host+"]:"+port+" "+info.HostKey+"\n"), 0o600)
	env := append(os.Environ(), "SSH_ASKPASS="+askpass, "SSH_ASKPASS_REQUIRE=force", "DISPLAY=:0")
	return &sshEnv{t: t, host: host, port: port, dir: dir, env: env}
}

func (e *sshEnv) opts() []string {
	return []string{"-o", "UserKnownHostsFile=" + filepath.Join(e.dir, "known_hosts"), "-o", "StrictHostKeyChecking=yes",
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password",
		"-o", "NumberOfPasswordPrompts=1", "-o", "BatchMode=no", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30"}
}

// run runs an OpenSSH tool and returns stdout, stderr and the exit code.
func (e *sshEnv) run(stdin string, name string, args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = e.env
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // no controlling tty: askpass is used
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	return out.String(), errb.String(), code
}

func (e *sshEnv) ssh(login string, extra ...string) []string {
	return append(append(append([]string{}, e.opts()...), "-p", e.port, login+"@"+e.host), extra...)
}

func TestSSHGateway(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "ssh1"})
	other := s.CreateVM(ctx, api.CreateVMRequest{Name: "ssh2"})
	tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{"ssh"}, TTL: "30m"})
	if err != nil {
		t.Fatal(err)
	}
	e := newSSHEnv(t, s, tok.Secret)

	t.Run("exec, users and exit status", func(t *testing.T) {
		out, errOut, code := e.run("", "ssh", e.ssh("ssh1", "echo $USER@$(hostname); echo oops >&2; exit 7")...)
		if code != 7 || out != "root@ssh1\n" || !strings.Contains(errOut, "oops") {
			t.Fatalf("ssh exec: %d %q %q", code, out, errOut)
		}
		out, _, code = e.run("", "ssh", e.ssh("ssh1+agent", "whoami; pwd")...)
		if code != 0 || out != "agent\n/home/agent\n" {
			t.Fatalf("ssh as agent: %d %q", code, out)
		}
		out, _, code = e.run("piped-stdin\n", "ssh", append([]string{"-o", "SetEnv=E2E_VAR=from-client"}, e.ssh("ssh1", "cat; echo var=$E2E_VAR")...)...)
		if code != 0 || out != "piped-stdin\nvar=from-client\n" {
			t.Fatalf("stdin: %d %q", code, out)
		}
		out, _, code = e.run("", "ssh", e.ssh("ssh1", "-tt", "tty; echo cols=$(tput cols)")...)
		if code != 0 || !strings.Contains(out, "/dev/pts/") {
			t.Fatalf("pty: %d %q", code, out)
		}
		out, _, code = e.run("echo in-shell-$((2+3))\nexit 5\n", "ssh", e.ssh("ssh1", "-tt")...)
		if code != 5 || !strings.Contains(out, "in-shell-5") {
			t.Fatalf("interactive shell: %d %q", code, out)
		}
	})

	t.Run("scp 100MiB both ways", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "big.bin")
		f, _ := os.Create(src)
		io.Copy(f, randomReader(100<<20, 2))
		f.Close()
		want, _ := sha(randomReader(100<<20, 2))
		start := time.Now()
		scpArgs := append(e.opts(), "-P", e.port)
		if _, errOut, code := e.run("", "scp", append(scpArgs, src, "ssh1@"+e.host+":/root/big.bin")...); code != 0 {
			t.Fatalf("scp up: %d %s", code, errOut)
		}
		up := time.Since(start)
		r := s.Exec(ctx, v.ID, "sha256sum /root/big.bin | cut -d' ' -f1")
		if strings.TrimSpace(r.Stdout) != want {
			t.Fatalf("uploaded sha %q want %s", r.Stdout, want)
		}
		start = time.Now()
		back := filepath.Join(dir, "back.bin")
		if _, errOut, code := e.run("", "scp", append(scpArgs, "ssh1@"+e.host+":/root/big.bin", back)...); code != 0 {
			t.Fatalf("scp down: %d %s", code, errOut)
		}
		down := time.Since(start)
		bf, _ := os.Open(back)
		got, _ := sha(bf)
		bf.Close()
		if got != want {
			t.Fatal("downloaded file differs")
		}
		t.Logf("scp through the gateway: up %.1f MiB/s, down %.1f MiB/s", 100/up.Seconds(), 100/down.Seconds())
	})

	t.Run("sftp and rsync", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "one.txt"), []byte("one\n"), 0o644)
		batch := filepath.Join(dir, "batch")
		os.WriteFile(batch, []byte("mkdir /tmp/sftpdir\nput "+filepath.Join(dir, "one.txt")+" /tmp/sftpdir/one.txt\nls -l /tmp/sftpdir\nget /etc/hostname "+filepath.Join(dir, "hn")+"\n"), 0o600)
		out, errOut, code := e.run("", "sftp", append(append(e.opts(), "-P", e.port, "-b", batch), "ssh1@"+e.host)...)
		if code != 0 || !strings.Contains(out, "one.txt") {
			t.Fatalf("sftp: %d %q %q", code, out, errOut)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "hn")); string(b) != "ssh1\n" {
			t.Fatalf("sftp get: %q", b)
		}
		tree := filepath.Join(dir, "tree")
		os.MkdirAll(filepath.Join(tree, "x", "y"), 0o755)
		for i := 0; i < 20; i++ {
			os.WriteFile(filepath.Join(tree, "x", "y", fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{byte(i)}, 1000*i), 0o644)
		}
		rsh := "ssh " + strings.Join(append(e.opts(), "-p", e.port), " ")
		if out, errOut, code := e.run("", "rsync", "-a", "-e", rsh, tree+"/", "ssh1+agent@"+e.host+":tree/"); code != 0 {
			t.Fatalf("rsync: %d %q %q", code, out, errOut)
		}
		r := s.Exec(ctx, v.ID, "find /home/agent/tree -type f | wc -l; stat -c %U /home/agent/tree/x/y/f19; wc -c < /home/agent/tree/x/y/f19")
		if r.Stdout != "20\nagent\n19000\n" {
			t.Fatalf("after rsync: %q %q", r.Stdout, r.Stderr)
		}
		// a second run transfers nothing
		out, _, code = e.run("", "rsync", "-a", "--stats", "-e", rsh, tree+"/", "ssh1+agent@"+e.host+":tree/")
		if code != 0 || !strings.Contains(out, "Number of regular files transferred: 0") {
			t.Fatalf("rsync again: %d %q", code, out)
		}
		// scp and sftp as agent: files are agent's, root's are out of reach
		os.WriteFile(filepath.Join(dir, "mine.txt"), []byte("agent's\n"), 0o640)
		if out, errOut, code := e.run("", "scp", append(append(e.opts(), "-P", e.port, "-p"), filepath.Join(dir, "mine.txt"), "ssh1+agent@"+e.host+":")...); code != 0 {
			t.Fatalf("scp as agent: %d %q %q", code, out, errOut)
		}
		if r := s.Exec(ctx, v.ID, "stat -c '%U %a' /home/agent/mine.txt; cat /home/agent/mine.txt"); r.Stdout != "agent 640\nagent's\n" {
			t.Fatalf("after scp as agent: %q %q", r.Stdout, r.Stderr)
		}
		// without -p the mode comes from the open itself: a private file stays private
		os.WriteFile(filepath.Join(dir, "key.txt"), []byte("private\n"), 0o600)
		if out, errOut, code := e.run("", "scp", append(append(e.opts(), "-P", e.port), filepath.Join(dir, "key.txt"), "ssh1+agent@"+e.host+":")...); code != 0 {
			t.Fatalf("scp of a 0600 file as agent: %d %q %q", code, out, errOut)
		}
		if r := s.Exec(ctx, v.ID, "stat -c '%U %a' /home/agent/key.txt"); r.Stdout != "agent 600\n" {
			t.Fatalf("mode of an uploaded 0600 file: %q", r.Stdout)
		}
		if _, errOut, code := e.run("", "scp", append(append(e.opts(), "-P", e.port), filepath.Join(dir, "mine.txt"), "ssh1+agent@"+e.host+":/root/")...); code == 0 || !strings.Contains(errOut, "ermission denied") {
			t.Fatalf("scp as agent into /root: %d %q", code, errOut)
		}
	})

	t.Run("local forwarding", func(t *testing.T) {
		r := s.Exec(ctx, v.ID, "mkdir -p /srv/www && echo forwarded-ok > /srv/www/index.html && (cd /srv/www && nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) ; sleep 2; echo started")
		if r.ExitCode != 0 {
			t.Fatalf("start server: %+v", r)
		}
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		lport := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cmd := exec.Command("ssh", e.ssh("ssh1", "-N", "-o", "ExitOnForwardFailure=yes", "-L", fmt.Sprintf("127.0.0.1:%d:localhost:8000", lport))...)
		cmd.Env = e.env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		var body string
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", lport))
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if body != "forwarded-ok\n" {
			t.Fatalf("through -L: %q", body)
		}
	})

	t.Run("remote forwarding", func(t *testing.T) {
		// ssh -R: a port inside the VM reaches a server on the client's side
		hostPort := hostServer(t)
		cmd := exec.Command("ssh", e.ssh("ssh1", "-N", "-o", "ExitOnForwardFailure=yes", "-R", fmt.Sprintf("127.0.0.1:9100:127.0.0.1:%d", hostPort))...)
		cmd.Env = e.env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }() // only the ssh this test started
		r := s.Exec(ctx, v.ID, "for i in $(seq 100); do curl -s -m 5 http://127.0.0.1:9100/ && exit 0; sleep 0.2; done; exit 1")
		if r.ExitCode != 0 || r.Stdout != "host-ok" {
			t.Fatalf("through -R: %+v", r)
		}
		// the forward ends with the ssh connection
		cmd.Process.Kill()
		cmd.Wait()
		r = s.Exec(ctx, v.ID, "for i in $(seq 100); do curl -s -m 5 http://127.0.0.1:9100/ || exit 0; sleep 0.2; done; exit 1")
		if r.ExitCode != 0 {
			t.Fatalf("port 9100 still forwarded after ssh exited: %+v", r)
		}
		// a user other than root cannot take a privileged port
		_, errOut, code := e.run("", "ssh", e.ssh("ssh1+agent", "-N", "-o", "ExitOnForwardFailure=yes", "-R", fmt.Sprintf("80:127.0.0.1:%d", hostPort))...)
		if code == 0 || !strings.Contains(errOut, "forwarding failed") {
			t.Fatalf("-R 80 as agent: %d %q", code, errOut)
		}
	})

	t.Run("window-change and signals", func(t *testing.T) {
		// OpenSSH sends window-change only from a real terminal and never
		// sends signals, so this drives the protocol with x/crypto/ssh.
		host, port := s.SSHHostPort()
		info, _ := s.Client.SSHInfo(ctx)
		hk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(info.HostKey))
		if err != nil {
			t.Fatal(err)
		}
		c, err := ssh.Dial("tcp", net.JoinHostPort(host, port), &ssh.ClientConfig{
			User: "ssh1", Auth: []ssh.AuthMethod{ssh.Password(tok.Secret)},
			HostKeyCallback: ssh.FixedHostKey(hk), Timeout: 30 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		sess.Stdout = pw
		lines := make(chan string, 64)
		go func() {
			buf := make([]byte, 4096)
			var acc string
			for {
				n, err := pr.Read(buf)
				acc += strings.ReplaceAll(string(buf[:n]), "\r", "")
				for {
					i := strings.IndexByte(acc, '\n')
					if i < 0 {
						break
					}
					lines <- acc[:i]
					acc = acc[i+1:]
				}
				if err != nil {
					close(lines)
					return
				}
			}
		}()
		waitLine := func(want string) {
			t.Helper()
			timeout := time.After(30 * time.Second)
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("session output ended before %q", want)
					}
					if l == want {
						return
					}
				case <-timeout:
					t.Fatalf("no %q from the session", want)
				}
			}
		}
		if err := sess.Start(`trap 'echo size-$(stty size | tr " " x)' WINCH; trap 'echo got-int; exit 9' INT; echo ready; while :; do sleep 0.1; done`); err != nil {
			t.Fatal(err)
		}
		waitLine("ready")
		if err := sess.WindowChange(40, 132); err != nil {
			t.Fatal(err)
		}
		waitLine("size-40x132")
		if err := sess.Signal(ssh.SIGINT); err != nil {
			t.Fatal(err)
		}
		waitLine("got-int")
		var ee *ssh.ExitError
		if err := sess.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 9 {
			t.Fatalf("exit after INT: %v", err)
		}
		pw.Close()
	})

	t.Run("agentvm ssh with a throwaway key", func(t *testing.T) {
		out, errOut, code := s.CLI("", "ssh", "ssh1", "--", "echo", "via-cli-$((40+2))")
		if code != 0 || out != "via-cli-42\n" {
			t.Fatalf("agentvm ssh: %d %q %q", code, out, errOut)
		}
		out, _, code = s.CLI("", "ssh", "ssh1", "--user", "agent", "--", "whoami; exit 3")
		if code != 3 || out != "agent\n" {
			t.Fatalf("agentvm ssh --user agent: %d %q", code, out)
		}
		// the throwaway tokens are revoked afterwards
		ts, _ := s.Client.ListTokens(ctx, v.ID)
		for _, tk := range ts {
			if tk.Name == "agentvm ssh" {
				t.Fatalf("throwaway token left behind: %+v", tk)
			}
		}
	})

	t.Run("refused logins", func(t *testing.T) {
		refused := func(name, password, login string) {
			t.Helper()
			e2 := newSSHEnv(t, s, password)
			out, errOut, code := e2.run("", "ssh", e2.ssh(login, "echo should-not-run")...)
			if code == 0 || strings.Contains(out, "should-not-run") {
				t.Fatalf("%s: login accepted: %q %q", name, out, errOut)
			}
		}
		refused("wrong password", "avt_0000", "ssh1")
		refused("token of another VM", tok.Secret, other.Name)
		noSSH, _ := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{"exec", "files"}})
		refused("token without ssh", noSSH.Secret, "ssh1")
		agentOnly, _ := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{"ssh"}, User: "agent"})
		refused("agent-only token as root", agentOnly.Secret, "ssh1+root")
		refused("unknown VM", tok.Secret, "nosuchvm")
		e3 := newSSHEnv(t, s, agentOnly.Secret)
		if out, _, code := e3.run("", "ssh", e3.ssh("ssh1", "whoami")...); code != 0 || out != "agent\n" {
			t.Fatalf("agent-only token defaults to agent: %d %q", code, out)
		}
		s.Client.RevokeToken(ctx, agentOnly.ID)
		refused("revoked token", agentOnly.Secret, "ssh1")
	})
}
