package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

func TestAptInstall(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "apt"})
	r, err := s.Client.Exec(ctx, "apt", api.ExecRequest{
		Shell:   "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tree && tree --version",
		Timeout: api.Duration(10 * time.Minute),
	})
	if err != nil || r.ExitCode != 0 || !strings.Contains(r.Stdout, "tree v") {
		t.Fatalf("apt-get install: %v exit %d\nstdout: %s\nstderr: %s", err, r.ExitCode, tail(r.Stdout), tail(r.Stderr))
	}
	// git and curl reach the outside through the same NAT
	if r := s.Exec(ctx, "apt", "curl -fsS -o /dev/null -w '%{http_code}' http://deb.debian.org/debian/dists/bookworm/Release"); r.Stdout != "200" {
		t.Fatalf("curl: %+v", r)
	}
}

func tail(s string) string { return testenv.Tail(s, 2000) }

// A VM must not reach services listening on the host: loopback through the
// gateway, the host's own addresses, or agentvm's API.
func TestVMCannotReachHost(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hits := make(chan string, 10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.RemoteAddr
		fmt.Fprint(w, "host-secret")
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "jail"})
	apiPort := s.URL[strings.LastIndex(s.URL, ":")+1:]
	targets := []string{
		fmt.Sprintf("%s:%d", v.Gateway, port),
		fmt.Sprintf("127.0.0.1:%d", port),     // the guest's own loopback: nothing there
		"192.168.127.254:" + fmt.Sprint(port), // gvisor-tap-vsock's default host-loopback NAT address
		v.Gateway + ":" + apiPort,
		"169.254.169.254:80",
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			targets = append(targets, fmt.Sprintf("%s:%d", ipn.IP, port), ipn.IP.String()+":"+apiPort)
		}
	}
	for _, tg := range targets {
		r := s.Exec(ctx, "jail", "curl -sS --max-time 4 http://"+tg+"/ ; echo \" exit=$?\"")
		if strings.Contains(r.Stdout, "host-secret") || strings.Contains(r.Stdout, "exit=0") {
			t.Errorf("VM reached %s: %q", tg, r.Stdout)
		}
	}
	select {
	case h := <-hits:
		t.Fatalf("host service was reached from the VM (%s)", h)
	default:
	}
	// The host reaches the VM's services through the daemon (not the other way round).
	s.Exec(ctx, "jail", "nohup python3 -m http.server 8000 --directory /etc >/dev/null 2>&1 &")
	var body string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		conn, err := s.Client.DialTCP(ctx, "jail", 8000)
		if err == nil {
			fmt.Fprint(conn, "GET /hostname HTTP/1.0\r\n\r\n")
			b := make([]byte, 4096)
			n, _ := readAll(conn, b)
			conn.Close()
			body = string(b[:n])
			if strings.Contains(body, "jail") {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(body, "200 OK") || !strings.Contains(body, "jail") {
		t.Fatalf("host -> guest port 8000: %q", body)
	}
	// `agentvm connect` half-closes: a service that reads until EOF still answers.
	s.Exec(ctx, "jail", `nohup python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000)); s.listen()
while True:
    c, _ = s.accept(); data = b""
    while True:
        b = c.recv(4096)
        if not b: break
        data += b
    c.sendall(data.upper()); c.close()
' >/dev/null 2>&1 &`)
	var out string
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(out, "SHOUT") && time.Now().Before(deadline); {
		out, _, _ = s.CLI("shout", "connect", "jail", "9000")
		time.Sleep(100 * time.Millisecond)
	}
	if out != "SHOUT" {
		t.Fatalf("agentvm connect with half-close: %q", out)
	}
}

func readAll(c interface{ Read([]byte) (int, error) }, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
