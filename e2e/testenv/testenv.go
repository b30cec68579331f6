// Package testenv starts real agentvm servers for end-to-end tests: it builds the
// binaries once, runs `agentvm serve` on a loopback port with its own data dir, and
// drives it through the Go SDK and the CLI.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/server"
	"github.com/agentvm/agentvm/pkg/client"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// RepoRoot is the repository root.
func RepoRoot() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(f)))
}

// Binaries builds agentvm and agentvm-guest once per test process (without -race,
// as the QEMU-heavy server should not be slowed down) and returns their directory.
func Binaries(t testing.TB) string {
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "agentvm-e2e-bin-")
		if buildErr != nil {
			return
		}
		root := RepoRoot()
		for _, b := range []struct {
			out, pkg string
			cgo      bool
		}{
			{"agentvm-guest", "./cmd/agentvm-guest", false},
			{"agentvm", "./cmd/agentvm", true},
		} {
			// -trimpath, as scripts/setup.sh builds bin/: the same guest
			// agent, so the images test.sh builds beforehand are the ones
			// the tests find (an image's key covers its agent's bytes).
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(binDir, b.out), b.pkg)
			cmd.Dir = root
			cmd.Env = os.Environ()
			if !b.cgo {
				cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// Require skips the test with a reason when the host cannot run VMs.
func Require(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("end-to-end tests need root (debootstrap builds the image)")
	}
	for _, b := range []string{"qemu-system-x86_64", "qemu-img", "debootstrap", "mkfs.ext4"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed (run scripts/setup.sh)", b)
		}
	}
}

// Server is one `agentvm serve` process.
type Server struct {
	t       testing.TB
	Bin     string
	DataDir string
	URL     string
	Token   string
	Client  *client.Client
	Args    []string
	Netns   string   // the network namespace it runs in ("" for the test's own)
	Env     []string // added to the test's environment (KEY=VALUE)
	cmd     *exec.Cmd
	logBuf  *syncBuffer
	exited  chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// Start runs a server on a fresh data dir (or dataDir if non-empty).
func Start(t testing.TB, dataDir string, extra ...string) *Server {
	t.Helper()
	Require(t)
	bin := Binaries(t)
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	s := &Server{t: t, Bin: bin, DataDir: dataDir, Args: extra}
	s.start()
	return s
}

// StartEnv runs a server as Start does, with env (KEY=VALUE) added to its
// environment: tests run in parallel, so none may change the process's own.
func StartEnv(t testing.TB, env []string, dataDir string, extra ...string) *Server {
	t.Helper()
	Require(t)
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	s := &Server{t: t, Bin: Binaries(t), DataDir: dataDir, Args: extra, Env: env}
	s.start()
	return s
}

// StartIn runs a server as Start does, in network namespace netns (give it
// --listen and the other listeners on an address of that namespace).
func StartIn(t testing.TB, netns, dataDir string, extra ...string) *Server {
	t.Helper()
	Require(t)
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	s := &Server{t: t, Bin: Binaries(t), DataDir: dataDir, Args: extra, Netns: netns}
	s.start()
	return s
}

func (s *Server) start() {
	t := s.t
	t.Helper()
	// The warm pool is off unless a test asks for it: its background restores would
	// compete for the two cores with what the tests time.
	args := append([]string{"serve", "--data-dir", s.DataDir, "--listen", "127.0.0.1:0", "--no-warm", "--warm-pool", "0", "--ssh-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0"}, s.Args...)
	cmd := exec.Command(filepath.Join(s.Bin, "agentvm"), args...)
	if s.Netns != "" { // ip netns exec execs the server: the pid is the server's
		cmd = exec.Command("ip", append([]string{"netns", "exec", s.Netns, filepath.Join(s.Bin, "agentvm")}, args...)...)
	}
	if len(s.Env) > 0 {
		cmd.Env = append(os.Environ(), s.Env...)
	}
	pr, pw, _ := os.Pipe()
	s.logBuf = &syncBuffer{}
	cmd.Stdout = s.logBuf
	cmd.Stderr = pw
	// A test binary killed before its cleanups (a timeout, the script
	// stopped) takes its servers with it: SIGTERM is a server's orderly
	// stop, which ends its VMs' QEMUs. In a process group of its own, it
	// is left alone by a signal to the test's group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() { cmd.Wait(); close(s.exited) }()
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			s.logBuf.Write([]byte(line + "\n"))
			if m := listenRe.FindStringSubmatch(line); m != nil && !sent {
				urlc <- m[1]
				sent = true
			}
		}
	}()
	select {
	case s.URL = <-urlc:
	case <-s.exited:
		t.Fatalf("agentvm serve exited at start:\n%s", s.logBuf.String())
	case <-time.After(10 * time.Minute): // a first run builds the image
		t.Fatalf("agentvm serve did not start:\n%s", s.logBuf.String())
	}
	tok, err := os.ReadFile(filepath.Join(s.DataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	s.Token = strings.TrimSpace(string(tok))
	s.Client = client.New(s.URL, s.Token)
	t.Cleanup(s.cleanup)
}

// SSHHostPort returns the SSH gateway's host and port.
func (s *Server) SSHHostPort() (string, string) {
	s.t.Helper()
	info, err := s.Client.SSHInfo(context.Background())
	if err != nil || !info.Enabled {
		s.t.Fatalf("ssh gateway: %v %+v", err, info)
	}
	h, p, _ := strings.Cut(info.Listen, ":")
	return h, p
}

// Logs returns the server's output so far.
func (s *Server) Logs() string { return s.logBuf.String() }

// Kill9 kills the server process with SIGKILL (VMs keep running).
func (s *Server) Kill9() {
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// Restart starts the server again on the same data dir.
func (s *Server) Restart() {
	s.start()
}

// cleanup deletes every VM through the API, then stops the server. If the API is
// gone it kills the VMs' QEMU processes by the pids the server recorded.
func (s *Server) cleanup() {
	select {
	case <-s.exited:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if vms, err := s.Client.ListVMs(ctx); err == nil {
		for _, v := range vms {
			if err := s.Client.DeleteVM(ctx, v.ID); err != nil && v.PID > 0 {
				syscall.Kill(v.PID, syscall.SIGKILL)
			}
		}
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", Tail(s.logBuf.String(), 6000))
	}
}

// Tail is the last n bytes of s (all of it when shorter), for failure
// messages.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// CopyFile copies a file (a test script from the repo into a temp dir).
func CopyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// CLICmd prepares the agentvm CLI against this server as the admin, for a
// test that drives the process itself (streams, signals).
func (s *Server) CLICmd(stdin string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.Bin, "agentvm"), args...)
	cmd.Env = append(os.Environ(), "AGENTVM_URL="+s.URL, "AGENTVM_DATA_DIR="+s.DataDir, "AGENTVM_TOKEN=")
	cmd.Stdin = strings.NewReader(stdin)
	return cmd
}

// CLI runs the agentvm CLI against this server and returns stdout, stderr and the exit code.
func (s *Server) CLI(stdin string, args ...string) (string, string, int) {
	s.t.Helper()
	cmd := s.CLICmd(stdin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("run agentvm %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// CreateVM creates a small VM (512 MiB) and registers its deletion.
func (s *Server) CreateVM(ctx context.Context, req api.CreateVMRequest) *api.VM {
	s.t.Helper()
	if req.Memory == 0 {
		req.Memory = 512 << 20
	}
	v, err := s.Client.CreateVM(ctx, req)
	if err != nil {
		s.t.Fatalf("create VM: %v", err)
	}
	return v
}

// Exec runs a shell string in a VM and returns its result, failing the test on API errors.
func (s *Server) Exec(ctx context.Context, vm, shell string) *api.ExecResult {
	s.t.Helper()
	r, err := s.Client.Exec(ctx, vm, api.ExecRequest{Shell: shell})
	if err != nil {
		s.t.Fatalf("exec %q: %v", shell, err)
	}
	return r
}

// QEMUProcesses returns the pids of live QEMU processes whose -name carries id.
func QEMUProcesses(id string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("guest="+id+",")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// AllQEMUProcesses returns the command lines of all live QEMU processes.
func AllQEMUProcesses() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("qemu-system")) {
			out = append(out, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// OOMScore is process pid's oom_score_adj ("" when unreadable).
func OOMScore(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj"))
	return strings.TrimSpace(string(b))
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// RunDirEntries counts the per-VM socket directories a server left in its run dir.
func RunDirEntries(dataDir string) int {
	ents, _ := os.ReadDir(server.RunDir(dataDir))
	return len(ents)
}

// Terminate stops the server with SIGTERM (a graceful shutdown) and waits for it,
// leaving its VMs to whatever the server does at shutdown.
func (s *Server) Terminate() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Minute):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// RemoveBinaries deletes the binaries Binaries built; call it from TestMain.
func RemoveBinaries() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}
