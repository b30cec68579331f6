package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// clusterSSH logs in to node b's VM onB through node a's SSH gateway with
// the real OpenSSH tools: the nodes show one host key, and exec with its
// exit status and stderr, a terminal, scp both ways and a TCP forward (-W,
// to the web server startWebServer runs in onB) all reach the VM; a revoke
// ends a relayed login that is still open.
func clusterSSH(t *testing.T, ctx context.Context, a, b *testenv.Server, onB string) {
	t.Helper()
	ia, err := a.Client.SSHInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := b.Client.SSHInfo(ctx)
	if err != nil || !ia.Enabled || ia.HostKey != ib.HostKey {
		t.Fatalf("the nodes' SSH host keys differ: %q %q %v", ia.HostKey, ib.HostKey, err)
	}
	tok, err := a.Client.CreateToken(ctx, api.CreateTokenRequest{VM: onB, Allow: []string{"ssh"}})
	if err != nil {
		t.Fatal(err)
	}
	e := newSSHEnv(t, a, tok.Secret)
	out, errOut, code := e.run("from-stdin\n", "ssh", e.ssh(onB, "cat; hostname; echo oops >&2; exit 7")...)
	if code != 7 || out != "from-stdin\n"+onB+"\n" || !strings.Contains(errOut, "oops") {
		t.Fatalf("ssh through node a: %d %q %q", code, out, errOut)
	}
	out, _, code = e.run("echo in-shell-$((2+3))\nexit 5\n", "ssh", e.ssh(onB, "-tt")...)
	if code != 5 || !strings.Contains(out, "in-shell-5") {
		t.Fatalf("interactive shell through node a: %d %q", code, out)
	}

	dir := t.TempDir()
	src, back := filepath.Join(dir, "up.bin"), filepath.Join(dir, "back.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := sha(randomReader(3<<20, 7))
	if _, err := f.ReadFrom(randomReader(3<<20, 7)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	scp := append(e.opts(), "-P", e.port)
	if _, errOut, code := e.run("", "scp", append(scp, src, onB+"@"+e.host+":/root/up.bin")...); code != 0 {
		t.Fatalf("scp to node b's VM through node a: %d %s", code, errOut)
	}
	if r := b.Exec(ctx, onB, "sha256sum /root/up.bin | cut -c1-64"); strings.TrimSpace(r.Stdout) != want {
		t.Fatalf("the file scp sent through node a, on node b: %+v (want %s)", r, want)
	}
	if _, errOut, code := e.run("", "scp", append(scp, onB+"@"+e.host+":/root/up.bin", back)...); code != 0 {
		t.Fatalf("scp from node b's VM through node a: %d %s", code, errOut)
	}
	bf, err := os.Open(back)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := sha(bf)
	bf.Close()
	if got != want {
		t.Fatalf("scp back through node a: %s, want %s", got, want)
	}
	out, errOut, code = e.run("GET /via-ssh HTTP/1.0\r\n\r\n", "ssh", e.ssh(onB, "-W", "127.0.0.1:8000")...)
	if code != 0 || !strings.Contains(out, "hello from HTTP/1.0 /via-ssh") {
		t.Fatalf("ssh -W to the VM's web server through node a: %d %q %q", code, out, errOut)
	}

	// ssh -R: a port inside node b's VM reaches a server on the client's
	// side, through node a (the owner opens forwarded-tcpip channels).
	hostPort := hostServer(t)
	rcmd := exec.Command("ssh", e.ssh(onB, "-N", "-o", "ExitOnForwardFailure=yes", "-R", fmt.Sprintf("127.0.0.1:9101:127.0.0.1:%d", hostPort))...)
	rcmd.Env = e.env
	rcmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := rcmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := b.Exec(ctx, onB, "for i in $(seq 150); do curl -s -m 5 http://127.0.0.1:9101/ && exit 0; sleep 0.2; done; exit 1")
	rcmd.Process.Kill() // only the ssh this test started
	rcmd.Wait()
	if r.ExitCode != 0 || r.Stdout != "host-ok" {
		t.Fatalf("ssh -R through node a: %+v", r)
	}

	// A relayed login that is still open ends at its token's revoke, on
	// both nodes.
	cmd := exec.Command("ssh", e.ssh(onB, "sleep 601")...)
	cmd.Env = e.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var stdout bytes.Buffer // read once the command is done
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	for deadline := time.Now().Add(time.Minute); strings.TrimSpace(b.Exec(ctx, onB, "pgrep -fx 'sleep 601' || true").Stdout) == ""; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relayed login did not start its command")
		}
	}
	if err := a.Client.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		exited <- nil // for the deferred wait
	case <-time.After(time.Minute):
		t.Fatal("a revoked token's relayed ssh login is still open")
	}
	for deadline := time.Now().Add(time.Minute); strings.TrimSpace(b.Exec(ctx, onB, "pgrep -fx 'sleep 601' || true").Stdout) != ""; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the revoked login's command still runs on node b")
		}
	}
	if _, _, code := e.run("", "ssh", e.ssh(onB, "true")...); code == 0 {
		t.Fatal("a revoked token logged in through node a")
	}
}
