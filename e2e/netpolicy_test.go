package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// hostServer serves "host-ok" on the host's loopback (a port the VM must
// not reach unless --allow-host opens it).
func hostServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host-ok") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// curl runs curl in the VM and returns its output and exit code.
func curl(t *testing.T, s *testenv.Server, vm, url string) (string, int) {
	t.Helper()
	r := s.Exec(context.Background(), vm, "curl -s -m 8 "+url)
	return r.Stdout, r.ExitCode
}

func TestEgressPolicy(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	port := hostServer(t)
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "eg1"})
	hostURL := fmt.Sprintf("http://host.agentvm.internal:%d/", port)
	gwURL := fmt.Sprintf("http://%s:%d/", strings.TrimSuffix(v.Gateway, ".1")+".254", port)

	if out, code := curl(t, s, v.ID, hostURL); code == 0 || out == "host-ok" {
		t.Fatalf("default policy reached the host's loopback: %d %q", code, out)
	}
	if out, _, code := s.CLI("", "egress", "eg1", "--allow-host", strconv.Itoa(port)); code != 0 {
		t.Fatalf("egress --allow-host: %d %q", code, out)
	}
	for _, u := range []string{hostURL, gwURL} {
		if out, code := curl(t, s, v.ID, u); code != 0 || out != "host-ok" {
			t.Fatalf("--allow-host %d: %s: %d %q", port, u, code, out)
		}
	}
	// agentvm's own ports stay closed whatever the policy says
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(s.URL, "http://"))
	if _, err := s.Client.SetEgress(ctx, v.ID, &api.Egress{AllowHost: []int{port, atoiMust(apiPort)}}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(t, s, v.ID, "http://host.agentvm.internal:"+apiPort+"/v1/health"); code == 0 {
		t.Fatalf("the VM reached agentvm's API through --allow-host: %q", out)
	}
	if _, _, code := s.CLI("", "egress", "eg1", "--egress", "deny"); code != 0 {
		t.Fatal("egress deny failed")
	}
	if out, code := curl(t, s, v.ID, hostURL); code == 0 {
		t.Fatalf("deny-all still reaches the host port: %q", out)
	}
	if out, code := curl(t, s, v.ID, "-I http://deb.debian.org/debian/"); code == 0 {
		t.Fatalf("deny-all reaches the internet: %q", out)
	}
	// A VM made from a snapshot of a denied VM stays denied.
	if _, err := s.Client.Snapshot(ctx, v.ID, "eg1-denied"); err != nil {
		t.Fatal(err)
	}
	child, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "eg1-child", From: "eg1-denied"})
	if err != nil {
		t.Fatal(err)
	}
	if child.Egress == nil || child.Egress.Mode != "deny" {
		t.Fatalf("child of a denied VM's snapshot has egress %+v", child.Egress)
	}
	if out, code := curl(t, s, child.ID, "-I http://deb.debian.org/debian/"); code == 0 {
		t.Fatalf("child of a denied VM's snapshot reaches the internet: %q", out)
	}
	if err := s.Client.DeleteVM(ctx, child.ID); err != nil {
		t.Fatal(err)
	}
	// allow list: the Debian mirror by name, nothing else
	if _, errOut, code := s.CLI("", "egress", "eg1", "--egress", "allow", "--allow", "deb.debian.org"); code != 0 {
		t.Fatalf("egress allow: %q", errOut)
	}
	if out, code := curl(t, s, v.ID, "-sI -o /dev/null -w %{http_code} http://deb.debian.org/debian/"); code != 0 || !strings.HasPrefix(out, "200") && !strings.HasPrefix(out, "30") {
		t.Fatalf("allow-listed mirror: %d %q", code, out)
	}
	if r := s.Exec(ctx, v.ID, "getent hosts example.com || echo unresolved"); !strings.Contains(r.Stdout, "unresolved") {
		t.Fatalf("a name outside the allow list resolved: %q", r.Stdout)
	}
	if out, code := curl(t, s, v.ID, hostURL); code == 0 {
		t.Fatalf("allow mode without --allow-host reaches the host: %q", out)
	}
	// bad input
	_, errOut, code := s.CLI("", "egress", "eg1", "--egress", "sometimes")
	if code == 0 || !strings.Contains(errOut, "public, deny or allow") {
		t.Fatalf("bad mode: %d %q", code, errOut)
	}
	_, err = s.Client.SetEgress(ctx, v.ID, &api.Egress{AllowHost: []int{70000}})
	wantStatus(t, err, 400, api.CodeInvalid)
	// back to the default
	if _, _, code := s.CLI("", "egress", "eg1", "--clear"); code != 0 {
		t.Fatal("egress --clear failed")
	}
	if out, code := curl(t, s, v.ID, "-sI -o /dev/null -w %{http_code} http://deb.debian.org/debian/"); code != 0 {
		t.Fatalf("public again: %d %q", code, out)
	}
}

func atoiMust(s string) int { n, _ := strconv.Atoi(s); return n }

func TestPrivateNetworks(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, errOut, code := s.CLI("", "network", "create", "proj"); code != 0 {
		t.Fatalf("network create: %d %q %q", code, out, errOut)
	}
	s.CLI("", "network", "create", "other")
	if _, errOut, code := s.CLI("", "create", "--name", "a1", "--memory", "512", "--network", "proj"); code != 0 {
		t.Fatalf("create --network: %q", errOut)
	}
	a2 := s.CreateVM(ctx, api.CreateVMRequest{Name: "a2", Network: "proj"})
	b1 := s.CreateVM(ctx, api.CreateVMRequest{Name: "b1", Network: "other"})
	c1 := s.CreateVM(ctx, api.CreateVMRequest{Name: "c1"})
	if r := s.Exec(ctx, a2.ID, "mkdir -p /srv/w && echo from-a2 > /srv/w/index.html && cd /srv/w && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &); for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"); r.ExitCode != 0 {
		t.Fatalf("server in a2: %+v", r)
	}
	for _, u := range []string{"http://a2:8000/", "http://" + a2.IP + ":8000/"} {
		if out, code := curl(t, s, "a1", u); code != 0 || out != "from-a2\n" {
			t.Fatalf("a1 -> %s: %d %q", u, code, out)
		}
	}
	for _, vm := range []string{b1.ID, c1.ID} {
		if out, code := curl(t, s, vm, "http://"+a2.IP+":8000/"); code == 0 {
			t.Fatalf("%s reached a2 across networks: %q", vm, out)
		}
		if r := s.Exec(ctx, vm, "getent hosts a2 || echo unresolved"); !strings.Contains(r.Stdout, "unresolved") {
			t.Fatalf("%s resolves a2: %q", vm, r.Stdout)
		}
	}
	// a forked child gets its own address and stays on the network
	fr, err := s.Client.Fork(ctx, "a1", 1)
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Children[0]
	a1, _ := s.Client.GetVM(ctx, "a1")
	if child.IP == a1.IP || child.Network != "proj" {
		t.Fatalf("fork child: ip %s (parent %s), network %q", child.IP, a1.IP, child.Network)
	}
	if out, code := curl(t, s, child.ID, "http://a2:8000/"); code != 0 || out != "from-a2\n" {
		t.Fatalf("fork child -> a2: %d %q", code, out)
	}
	// members are listed; a network with members cannot be deleted
	out, _, _ := s.CLI("", "network", "ls")
	if !strings.Contains(out, "proj") || !strings.Contains(out, "a1") || !strings.Contains(out, "a2") {
		t.Fatalf("network ls: %q", out)
	}
	_, errOut, code := s.CLI("", "network", "rm", "proj")
	if code == 0 || !strings.Contains(errOut, "still has VMs") {
		t.Fatalf("network rm with members: %d %q", code, errOut)
	}
	// a network-level policy: its members lose the internet but keep each
	// other; a VM outside the network is unaffected
	mirror := "-sI -o /dev/null -w %{http_code} http://deb.debian.org/debian/"
	if _, errOut, code := s.CLI("", "network", "egress", "proj", "--egress", "deny"); code != 0 {
		t.Fatalf("network egress deny: %q", errOut)
	}
	if out, code := curl(t, s, a2.ID, mirror); code == 0 {
		t.Fatalf("a2 reaches the internet under its network's deny: %q", out)
	}
	if out, code := curl(t, s, "a1", "http://a2:8000/"); code != 0 || out != "from-a2\n" {
		t.Fatalf("a1 -> a2 under the network's deny: %d %q", code, out)
	}
	if out, code := curl(t, s, c1.ID, mirror); code != 0 {
		t.Fatalf("c1 (no network) lost the internet: %d %q", code, out)
	}
	if _, errOut, code := s.CLI("", "network", "egress", "proj", "--egress", "public"); code != 0 {
		t.Fatalf("network egress public: %q", errOut)
	}
	if out, code := curl(t, s, a2.ID, mirror); code != 0 {
		t.Fatalf("a2 after the network went public again: %d %q", code, out)
	}
	// detach: no more route
	if _, _, code := s.CLI("", "network", "detach", "a1"); code != 0 {
		t.Fatal("detach failed")
	}
	if out, code := curl(t, s, "a1", "http://"+a2.IP+":8000/"); code == 0 {
		t.Fatalf("a1 still reaches a2 after detach: %q", out)
	}
	_, errOut, code = s.CLI("", "create", "--name", "x1", "--network", "nosuch")
	if code == 0 || !strings.Contains(errOut, "no network") {
		t.Fatalf("create on a missing network: %d %q", code, errOut)
	}
}
