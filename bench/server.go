package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	agentvmserver "github.com/agentvm/agentvm/internal/server"
	"github.com/agentvm/agentvm/pkg/client"
)

// buildBinaries builds agentvm (cgo as usual) and a static agentvm-guest into tmp/bin.
func buildBinaries(ctx context.Context, root, tmp string) (string, error) {
	bin := filepath.Join(tmp, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	for _, b := range []struct {
		out, pkg string
		static   bool
	}{
		{"agentvm", "./cmd/agentvm", false},
		{"agentvm-guest", "./cmd/agentvm-guest", true},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = os.Environ()
		if b.static {
			cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return bin, nil
}

// ensureImage builds the guest image for this agent binary if it is not cached yet,
// so that the measured first create is the template cold boot, not the image build.
func ensureImage(ctx context.Context, bin string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "agentvm"), "image", "build", "--force=false",
		"--guest-agent", filepath.Join(bin, "agentvm-guest"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("agentvm image build: %v\n%s", err, out)
	}
	return nil
}

type server struct {
	bin, dataDir, templateDir string
	url, token                string
	client                    *client.Client
	cmd                       *exec.Cmd
	exited                    chan struct{}
	log                       *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listenRe = regexp.MustCompile(`agentvm listening on (http://[0-9.:]+)`)

// startServer runs `agentvm serve` on a fresh data dir and, unless keepTemplate, a
// fresh empty template dir so that the first create cold-boots the template.
// startServer starts `agentvm serve` with its own data dir under tmp. The warm pool
// is off unless warmPool > 0, so creates measure the restore path.
func startServer(ctx context.Context, bin, tmp string, keepTemplate bool, warmPool int, extra ...string) (*server, error) {
	s := &server{bin: bin, dataDir: filepath.Join(tmp, "data"), log: &syncBuffer{}}
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return nil, err
	}
	args := []string{"serve", "--data-dir", s.dataDir, "--listen", "127.0.0.1:0", "--no-warm", "--warm-pool", fmt.Sprint(warmPool), "--ssh-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0"}
	if keepTemplate {
		s.templateDir = defaultTemplateDir()
	} else {
		s.templateDir = filepath.Join(tmp, "templates")
		if err := os.MkdirAll(s.templateDir, 0o700); err != nil {
			return nil, err
		}
		args = append(args, "--template-dir", s.templateDir)
	}
	args = append(args, extra...)
	cmd := exec.Command(filepath.Join(bin, "agentvm"), args...)
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = s.log
	cmd.Stderr = pw
	// Own process group: a Ctrl-C in the terminal reaches only the bench, which
	// then deletes its VMs through the API before stopping the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	pw.Close()
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() { cmd.Wait(); close(s.exited) }()
	urlc := make(chan string, 1)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			s.log.Write([]byte(line + "\n"))
			if m := listenRe.FindStringSubmatch(line); m != nil && !sent {
				urlc <- m[1]
				sent = true
			}
		}
	}()
	select {
	case s.url = <-urlc:
	case <-s.exited:
		return nil, fmt.Errorf("agentvm serve exited at start:\n%s", s.log.String())
	case <-ctx.Done():
		s.stop()
		return nil, ctx.Err()
	case <-time.After(5 * time.Minute):
		s.stop()
		return nil, fmt.Errorf("agentvm serve did not start within 5m:\n%s", s.log.String())
	}
	tok, err := os.ReadFile(filepath.Join(s.dataDir, "admin.token"))
	if err != nil {
		s.stop()
		return nil, err
	}
	s.token = strings.TrimSpace(string(tok))
	s.client = client.New(s.url, s.token)
	return s, nil
}

// stop sends SIGTERM to the server (the pid we started) and waits; SIGKILL after 30s.
func (s *server) stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return nil
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
		return errors.New("server did not exit 30s after SIGTERM; killed it")
	}
}

// removeRunDir removes the server's socket directory (see server.RunDir)
// if it is empty: a server that was killed leaves it behind.
func (s *server) removeRunDir() {
	os.Remove(agentvmserver.RunDir(s.dataDir)) // fails harmlessly unless it exists and is empty
}

func (s *server) logTail(n int) string {
	l := s.log.String()
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return l
}

// cliEnv is the environment for running the CLI against this server.
func (s *server) cliEnv() []string {
	return append(os.Environ(), "AGENTVM_URL="+s.url, "AGENTVM_TOKEN="+s.token, "AGENTVM_DATA_DIR="+s.dataDir)
}

// defaultTemplateDir mirrors the server's default: $AGENTVM_TEMPLATE_DIR, else
// <cache-dir>/templates with the cache dir from $AGENTVM_CACHE_DIR, $XDG_CACHE_HOME
// or ~/.cache/agentvm.
func defaultTemplateDir() string {
	if d := os.Getenv("AGENTVM_TEMPLATE_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("AGENTVM_CACHE_DIR")
	if cache == "" {
		if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
			cache = filepath.Join(d, "agentvm")
		} else {
			home, err := os.UserHomeDir()
			if err != nil || home == "" {
				home = "/root"
			}
			cache = filepath.Join(home, ".cache", "agentvm")
		}
	}
	return filepath.Join(cache, "templates")
}

func qemuVersion() string { return qemuVersionOf("qemu-system-x86_64") }

// qemuVersionOf is the first line of `bin --version`.
func qemuVersionOf(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return trimLine(string(out))
}

func trimLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}

// startPoolServer starts a second server with a warm pool of one VM under
// b.tmp/name, on the template this run's main server built (serve reads
// AGENTVM_TEMPLATE_DIR as the default of --template-dir).
func (b *bench) startPoolServer(ctx context.Context, name string) (*server, error) {
	dir := filepath.Join(b.tmp, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	os.Setenv("AGENTVM_TEMPLATE_DIR", b.srv.templateDir)
	defer os.Unsetenv("AGENTVM_TEMPLATE_DIR")
	return startServer(ctx, b.srv.bin, dir, true, 1)
}
