// Package s3test runs a real S3-compatible server for the tests and
// benchmarks that need one: Versity's S3 gateway (Apache 2.0) serving a
// directory on loopback, built from its Go module into the agentvm cache
// on first use (scripts/test.sh builds it beforehand).
package s3test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/image"
)

// Module is the gateway's Go module and version.
const Module = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Server is a running S3 server with one bucket.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Bucket   string
	Root     string // the gateway's directory: Root/<bucket>/<key> are the objects
	Access   string
	Secret   string

	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// Start starts a server on a new directory under dir with bucket "agentvm".
func Start(ctx context.Context, dir string) (*Server, error) {
	bin, err := Binary(ctx)
	if err != nil {
		return nil, err
	}
	s := &Server{Bucket: "agentvm", Root: filepath.Join(dir, "s3"), Access: "agentvm-test", Secret: "agentvm-test-secret-key"}
	if err := os.MkdirAll(filepath.Join(s.Root, s.Bucket), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s.Endpoint = "http://" + addr
	if s.log, err = os.Create(filepath.Join(dir, "versitygw.log")); err != nil {
		return nil, err
	}
	s.cmd = exec.Command(bin, "--port", addr, "--access", s.Access, "--secret", s.Secret, "posix", s.Root)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL} // ends with the test binary
	if err := s.cmd.Start(); err != nil {
		s.log.Close()
		return nil, err
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return s, nil
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(s.log.Name())
			s.log.Close()
			return nil, fmt.Errorf("versitygw exited at start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw did not answer on %s: %v", addr, err)
		}
	}
}

// StartT starts a server for test t, stopped when it ends. A daemon finds
// it with the variables of Environ in its environment.
func StartT(t *testing.T) *Server {
	t.Helper()
	s, err := Start(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Environ is Env as KEY=VALUE entries, for exec.Cmd.Env.
func (s *Server) Environ() []string {
	var out []string
	for k, v := range s.Env() {
		out = append(out, k+"="+v)
	}
	return out
}

// Env is what a daemon needs in its environment to use the server.
func (s *Server) Env() map[string]string {
	return map[string]string{"AWS_ACCESS_KEY_ID": s.Access, "AWS_SECRET_ACCESS_KEY": s.Secret, "AWS_REGION": "us-east-1"}
}

// URL is the --objects URL of prefix in the bucket.
func (s *Server) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s", s.Bucket, prefix, s.Endpoint)
}

// Stop stops the server (the pid it started).
func (s *Server) Stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.log.Close()
}

// Binary returns the gateway's binary, building it into the cache once.
func Binary(ctx context.Context) (string, error) {
	dir := filepath.Join(image.DefaultCacheDir(), "tools", "versitygw-v1.8.0")
	bin := filepath.Join(dir, "versitygw")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "install", Module)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=", "GO111MODULE=on")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", Module, err, out)
	}
	return bin, nil
}
