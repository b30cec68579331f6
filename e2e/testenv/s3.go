package testenv

import (
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

// VersityGW is the S3 server the tests use: Versity's S3 gateway (Apache
// 2.0) on a directory, built from its Go module on first use.
const VersityGW = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// S3 is a running S3-compatible server with one bucket.
type S3 struct {
	Endpoint string // http://127.0.0.1:PORT
	Bucket   string
	Root     string // the gateway's directory: Root/<bucket>/<key> are the objects
	Access   string
	Secret   string
}

// StartS3 starts a real S3 server (Versity's gateway on a temp dir) on
// loopback with bucket "agentvm", stopped when t ends. It sets the AWS_*
// variables the daemon reads, so servers started after it use it.
func StartS3(t *testing.T) *S3 {
	t.Helper()
	bin := versityBinary(t)
	s := &S3{Bucket: "agentvm", Root: t.TempDir(), Access: "agentvm-test", Secret: "agentvm-test-secret-key"}
	if err := os.Mkdir(filepath.Join(s.Root, s.Bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s.Endpoint = "http://" + addr
	cmd := exec.Command(bin, "--port", addr, "--access", s.Access, "--secret", s.Secret, "posix", s.Root)
	log, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		log.Close()
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("versitygw exited at start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw did not answer on %s: %v", addr, err)
		}
	}
	t.Setenv("AWS_ACCESS_KEY_ID", s.Access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s.Secret)
	t.Setenv("AWS_REGION", "us-east-1")
	return s
}

// URL is the --objects URL of prefix in the bucket.
func (s *S3) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s", s.Bucket, prefix, s.Endpoint)
}

// versityBinary builds versitygw into the cache dir once.
func versityBinary(t *testing.T) string {
	dir := filepath.Join(image.DefaultCacheDir(), "tools", "versitygw-v1.8.0")
	bin := filepath.Join(dir, "versitygw")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "install", VersityGW)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=", "GO111MODULE=on")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", VersityGW, err, out)
	}
	return bin
}
