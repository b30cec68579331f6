package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// The hosted-git benchmark (issue 34's measure): a push and a clone of a
// 100 MiB repository through agentvm's /git/ (git http-backend behind the
// daemon) against git over SSH to a bare repository on the same disk
// (the host's OpenSSH sshd, started by the run on a loopback port with a
// key of its own), each as throughput.

// GitReport is the result of -git.
type GitReport struct {
	RepoMiB    float64 `json:"repo_mib"`
	PushHTTP   Stats   `json:"push_agentvm_ms"`
	PushSSH    Stats   `json:"push_ssh_ms"`
	CloneHTTP  Stats   `json:"clone_agentvm_ms"`
	CloneSSH   Stats   `json:"clone_ssh_ms"`
	PushRatio  float64 `json:"push_throughput_agentvm_over_ssh"`
	CloneRatio float64 `json:"clone_throughput_agentvm_over_ssh"`
}

var gitRounds = 3

func (b *bench) runGit(ctx context.Context) error {
	r := &GitReport{}
	b.r.Git = r
	dir := filepath.Join(b.tmp, "git")
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	// 100 MiB of incompressible files in one commit.
	for i := 0; i < 25; i++ {
		f, err := os.Create(filepath.Join(src, fmt.Sprintf("blob%02d.bin", i)))
		if err != nil {
			return err
		}
		_, err = io.CopyN(f, rand.Reader, 4<<20)
		f.Close()
		if err != nil {
			return err
		}
	}
	r.RepoMiB = 100
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "."}, {"commit", "-q", "-m", "blobs"}} {
		if out, err := benchGit(src, nil, args...); err != nil {
			return fmt.Errorf("git %v: %v %s", args, err, out)
		}
	}
	sshURL, stopSSH, err := startSSHD(ctx, dir)
	if err != nil {
		return fmt.Errorf("sshd (apt-get install openssh-server): %w", err)
	}
	defer stopSSH()
	sshEnv := []string{"GIT_SSH_COMMAND=ssh -F /dev/null -i " + filepath.Join(dir, "id") + " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"}
	token := b.srv.token
	var pushHTTP, pushSSH, cloneHTTP, cloneSSH []float64
	for i := 0; i < gitRounds; i++ {
		name := fmt.Sprintf("bench%d", i)
		if _, err := b.c.CreateRepo(ctx, api.CreateRepoRequest{Name: name}); err != nil {
			return err
		}
		bare := filepath.Join(dir, name+".git")
		if out, err := benchGit(dir, nil, "init", "-q", "--bare", bare); err != nil {
			return fmt.Errorf("%v %s", err, out)
		}
		httpURL := strings.Replace(b.srv.url, "http://", "http://x:"+token+"@", 1) + "/git/" + name + ".git"
		for _, p := range []struct {
			url string
			env []string
			to  *[]float64
		}{{httpURL, nil, &pushHTTP}, {sshURL + bare, sshEnv, &pushSSH}} {
			t0 := time.Now()
			if out, err := benchGit(src, p.env, "push", "-q", p.url, "main"); err != nil {
				return fmt.Errorf("push to %s: %v %s", p.url, err, out)
			}
			*p.to = append(*p.to, float64(time.Since(t0).Milliseconds()))
		}
		for _, p := range []struct {
			url string
			env []string
			to  *[]float64
		}{{httpURL, nil, &cloneHTTP}, {sshURL + bare, sshEnv, &cloneSSH}} {
			into := filepath.Join(dir, fmt.Sprintf("clone-%d-%d", i, len(*p.to)))
			t0 := time.Now()
			if out, err := benchGit(dir, p.env, "clone", "-q", p.url, into); err != nil {
				return fmt.Errorf("clone of %s: %v %s", p.url, err, out)
			}
			*p.to = append(*p.to, float64(time.Since(t0).Milliseconds()))
			os.RemoveAll(into)
		}
		logf("git: round %d/%d: push %.0f ms vs %.0f ms over ssh, clone %.0f ms vs %.0f ms", i+1, gitRounds,
			pushHTTP[i], pushSSH[i], cloneHTTP[i], cloneSSH[i])
		b.c.DeleteRepo(ctx, name)
		os.RemoveAll(bare)
	}
	r.PushHTTP, r.PushSSH, r.CloneHTTP, r.CloneSSH = summarize(pushHTTP), summarize(pushSSH), summarize(cloneHTTP), summarize(cloneSSH)
	// Throughput is the inverse of the time: agentvm's over ssh's.
	r.PushRatio = ratio(r.PushSSH.P50, r.PushHTTP.P50)
	r.CloneRatio = ratio(r.CloneSSH.P50, r.CloneHTTP.P50)
	return nil
}

func benchGit(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GIT_TERMINAL_PROMPT=0", "GIT_AUTHOR_NAME=b", "GIT_AUTHOR_EMAIL=b@b",
		"GIT_COMMITTER_NAME=b", "GIT_COMMITTER_EMAIL=b@b", "GIT_CONFIG_NOSYSTEM=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startSSHD runs the host's sshd on a free loopback port, with a host key
// and a client key of its own in dir, and returns the ssh:// URL prefix
// of this host's root.
func startSSHD(ctx context.Context, dir string) (string, func(), error) {
	sshd, err := exec.LookPath("sshd")
	if err != nil {
		sshd = "/usr/sbin/sshd"
	}
	if _, err := os.Stat(sshd); err != nil {
		return "", nil, err
	}
	for _, k := range []string{"host", "id"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("ssh-keygen: %v %s", err, out)
		}
	}
	pub, _ := os.ReadFile(filepath.Join(dir, "id.pub"))
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := fmt.Sprintf("ListenAddress 127.0.0.1:%d\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
		port, filepath.Join(dir, "host"), filepath.Join(dir, "authorized_keys"))
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		return "", nil, err
	}
	os.MkdirAll("/run/sshd", 0o755)
	cmd := exec.Command(sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("sshd did not listen: %s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Sprintf("ssh://root@127.0.0.1:%d", port), stop, nil
}

// PrintGit prints the -git table.
func (r *Report) PrintGit(w io.Writer) {
	g := r.Git
	if g == nil {
		return
	}
	fmt.Fprintf(w, "\nHosted git: a %.0f MiB repository (incompressible), push and clone, %d rounds\n", g.RepoMiB, gitRounds)
	statsLine(w, "push through agentvm /git/", g.PushHTTP)
	statsLine(w, "push over ssh, same disk", g.PushSSH)
	statsLine(w, "clone through agentvm /git/", g.CloneHTTP)
	statsLine(w, "clone over ssh, same disk", g.CloneSSH)
	fmt.Fprintf(w, "  push throughput, agentvm over ssh (p50)   %.3fx (the issue wants >= 0.8x)\n", g.PushRatio)
	fmt.Fprintf(w, "  clone throughput, agentvm over ssh (p50)  %.3fx (the issue wants >= 0.8x)\n", g.CloneRatio)
}
