package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/pgtest"
)

// netnsLAN is a bridge on the test's host with network namespaces on it,
// each with one address: nodes that reach each other only over it.
type netnsLAN struct {
	t      *testing.T
	tag    string // this run's, in every name it makes
	prefix string // e.g. 10.231.57.
	bridge string
	n      int
}

func (l *netnsLAN) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetnsLAN makes the bridge (the host is .1 on it); everything goes
// when the test ends.
func newNetnsLAN(t *testing.T) *netnsLAN {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("network namespaces need root")
	}
	n := rand.IntN(200)
	l := &netnsLAN{t: t, tag: fmt.Sprintf("%x", rand.Uint32()&0xffffff), prefix: fmt.Sprintf("10.231.%d.", 20+n)}
	l.bridge = "avmbr" + l.tag
	l.ip("link", "add", l.bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", l.bridge).Run() })
	// A host whose firewall filters bridged traffic (br_netfilter with a
	// DROP forward policy, as Docker sets) must not see this bridge's.
	exec.Command("ip", "link", "set", l.bridge, "type", "bridge", "nf_call_iptables", "0").Run()
	l.ip("addr", "add", l.prefix+"1/24", "dev", l.bridge)
	l.ip("link", "set", l.bridge, "up")
	return l
}

// join makes a namespace on the bridge and returns its name and address.
func (l *netnsLAN) join() (string, string) {
	l.t.Helper()
	l.n++
	ns, host, peer := fmt.Sprintf("avmns%s-%d", l.tag, l.n), fmt.Sprintf("avmh%s-%d", l.tag, l.n), fmt.Sprintf("avmp%s-%d", l.tag, l.n)
	addr := fmt.Sprintf("%s%d", l.prefix, l.n+1)
	l.ip("netns", "add", ns)
	l.t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	l.ip("link", "add", host, "type", "veth", "peer", "name", peer)
	l.t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() }) // (gone already once its peer's namespace is)
	l.ip("link", "set", peer, "netns", ns)
	l.ip("link", "set", host, "master", l.bridge)
	l.ip("link", "set", host, "up")
	l.ip("-n", ns, "addr", "add", addr+"/24", "dev", peer)
	l.ip("-n", ns, "link", "set", peer, "up")
	l.ip("-n", ns, "link", "set", "lo", "up")
	return ns, addr
}

// Two nodes, each in its own network namespace, that reach each other and
// the test only over a bridge (PostgreSQL is shared through its socket
// file). PostgreSQL restarts (down for 2 s) while creates run through both
// nodes: statements wait for it, so every create succeeds and makes one
// VM, and no node is fenced. Then node b's VM is driven through node a
// over the bridge: exec streamed, SSH, a preview, and a revoke through
// node a ending a stream on node b.
func TestClusterNamespaces(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	lan := newNetnsLAN(t)
	pg := pgtest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name string) *testenv.Server {
		ns, addr := lan.join()
		return testenv.StartIn(t, ns, "", "--store", dsn, "--cluster", "--node-name", name, "--lease", "12s",
			"--listen", addr+":0", "--peer-listen", addr+":0", "--ssh-listen", addr+":0", "--proxy-listen", addr+":0")
	}
	a, b := node("node-a"), node("node-b")
	nodes, err := a.Client.ListNodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("node ls: %+v %v", nodes, err)
	}
	for _, n := range nodes {
		if !strings.HasPrefix(n.PeerAddress, lan.prefix) || !strings.HasPrefix(n.Address, lan.prefix) {
			t.Fatalf("node %s is not on the bridge: %+v", n.Name, n)
		}
	}

	const count = 4
	type result struct {
		key string
		via *testenv.Server
		err error
	}
	results := make(chan result, count)
	req := func(key string) api.CreateVMRequest {
		return api.CreateVMRequest{IdempotencyKey: key, Labels: map[string]string{"k": key}}
	}
	create := func(i int) {
		via, key := a, fmt.Sprintf("pg-restart-%d", i)
		if i%2 == 1 {
			via = b
		}
		go func() {
			_, err := via.Client.CreateVM(ctx, req(key))
			results <- result{key, via, err}
		}()
	}
	// (The sleeps are not deadlines: they land the restart among creates
	// that are under way, and two more creates in it.)
	create(0)
	create(1)
	time.Sleep(300 * time.Millisecond)
	restarting := time.Now()
	restarted := make(chan error, 1)
	go func() { restarted <- pg.Restart(ctx, 2*time.Second) }() // down for 2 s: less than a lease
	time.Sleep(100 * time.Millisecond)
	create(2)
	create(3)
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres restarted in %.1f s", time.Since(restarting).Seconds())
	failed := 0
	for range count {
		r := <-results
		if r.err == nil {
			continue
		}
		failed++
		t.Errorf("create %s while postgres restarted: %v", r.key, r.err)
	}
	if failed > 0 { // (a 2 s restart is less than a quarter of the 12 s lease: statements wait for it)
		t.Fatalf("%d of %d creates failed while postgres restarted\n%s", failed, count, a.Logs())
	}
	vms, err := a.Client.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	made := map[string]int{}
	for _, v := range vms {
		made[v.Labels["k"]]++
		if v.State != api.StateRunning {
			t.Fatalf("VM %s (%s) after the restart: %s %s", v.Name, v.Labels["k"], v.State, v.Error)
		}
		if r := b.Exec(ctx, v.ID, "echo up"); r.Stdout != "up\n" {
			t.Fatalf("exec in %s (node %s) through node b: %+v", v.Name, v.Node, r)
		}
	}
	for i := range count {
		if key := fmt.Sprintf("pg-restart-%d", i); made[key] != 1 {
			t.Fatalf("create %s made %d VMs: %+v", key, made[key], vms)
		}
	}
	if len(vms) != count {
		t.Fatalf("%d VMs after %d creates: %+v", len(vms), count, vms)
	}
	if nodes, err = b.Client.ListNodes(ctx); err != nil || len(nodes) != 2 {
		t.Fatalf("nodes after the restart: %+v %v", nodes, err)
	}
	for _, n := range nodes {
		if !n.Alive || n.Generation != 1 {
			t.Fatalf("node %s after the restart: alive %v, generation %d (a restart shorter than the lease must not fence it)", n.Name, n.Alive, n.Generation)
		}
	}

	// Node b's VM through node a, over the bridge. (Creates sent at once
	// may all go to one node: each chose the roomiest before the others
	// held their memory. Then a create sent alone goes to node b.)
	onB := ""
	for _, v := range vms {
		if v.Node == "node-b" {
			onB = v.Name
		}
	}
	if onB == "" {
		if vb := a.CreateVM(ctx, api.CreateVMRequest{Name: "on-b"}); vb.Node == "node-b" {
			onB = vb.Name
		} else {
			t.Fatalf("a create with every other VM on node-a went to %s", vb.Node)
		}
	}
	var out bytes.Buffer
	st, err := a.Client.Run(ctx, onB, api.ExecRequest{Cmd: []string{"sh", "-c", "cat; hostname"}}, strings.NewReader("streamed\n"), &out, io.Discard)
	if err != nil || st.ExitCode != 0 || out.String() != "streamed\n"+onB+"\n" {
		t.Fatalf("upgraded exec through node a: %+v %v %q", st, err, out.String())
	}
	tok, err := a.Client.CreateToken(ctx, api.CreateTokenRequest{VM: onB, Allow: []string{"ssh"}})
	if err != nil {
		t.Fatal(err)
	}
	e := newSSHEnv(t, a, tok.Secret)
	if got, errOut, code := e.run("", "ssh", e.ssh(onB, "hostname; exit 3")...); code != 3 || got != onB+"\n" {
		t.Fatalf("ssh through node a's gateway: %d %q %q", code, got, errOut)
	}
	startWebServer(t, b, onB)
	h, err := a.Client.Health(ctx)
	if err != nil || !strings.HasPrefix(h.Proxy, lan.prefix) {
		t.Fatalf("health of node a: %+v %v", h, err)
	}
	pv := &previewEnv{t: t, s: a, proxy: h.Proxy, domain: h.Domain}
	if resp, body := pv.do("GET", pv.host(8000, onB), "/ns", nil, map[string]string{"Authorization": "Bearer " + a.Token}); resp.StatusCode != 200 || body != "hello from HTTP/1.1 /ns\n" {
		t.Fatalf("preview of node b's VM through node a: %d %q", resp.StatusCode, body)
	}
	// Node b hears of a revoke through node a (the database's NOTIFY,
	// listened to again after the restart).
	revokeEndsStream(t, ctx, a, b, b, onB, "/tmp/revoke-across-namespaces")
}
