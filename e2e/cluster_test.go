package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/pkg/client"
)

// Two daemons as nodes of one cluster on a real PostgreSQL: both join and
// list each other with their capacity and QEMU; creates sent to one node
// spread over both; each lists every VM with its node and forwards
// requests about the other's VMs to it (clusterRouting). When the database stops answering
// (its processes frozen, as in a network partition) each node kills its
// VMs before its lease can run out; when it answers again they join again
// with a new generation, the killed VMs are recorded crashed with the
// reason, and operations work again. A node that stops leaves at once, and
// its VMs are shown lost.
func TestClusterNodes(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	pg := pgtest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testenv.Start(t, "", "--store", dsn, "--cluster", "--node-name", "node-a", "--lease", "6s")
	b := testenv.Start(t, "", "--store", dsn, "--cluster", "--node-name", "node-b", "--lease", "6s")

	nodes, err := a.Client.ListNodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("node ls: %+v %v", nodes, err)
	}
	for _, n := range nodes {
		if !n.Alive || n.Generation != 1 || n.CPUs < 1 || n.MemoryMiB < 1 || n.QEMUVersion == "" || n.Accel == "" || n.Self != (n.Name == "node-a") {
			t.Fatalf("node %+v", n)
		}
	}
	out, _, code := a.CLI("", "node", "ls")
	if code != 0 || !strings.Contains(out, "node-a") || !strings.Contains(out, "node-b") || !strings.Contains(out, "alive (this one)") {
		t.Fatalf("agentvm node ls:\n%s", out)
	}

	// Two creates sent to node a spread over both nodes (the roomiest
	// node takes each).
	va := a.CreateVM(ctx, api.CreateVMRequest{Name: "vm-1"})
	vb := a.CreateVM(ctx, api.CreateVMRequest{Name: "vm-2"})
	if va.Node == vb.Node || (va.Node != "node-a" && va.Node != "node-b") || (vb.Node != "node-a" && vb.Node != "node-b") {
		t.Fatalf("nodes of two creates sent to node a: %q %q", va.Node, vb.Node)
	}
	if va.Node == "node-b" {
		va, vb = vb, va
	}
	onA, onB := va.Name, vb.Name
	// A drain needs an object store (these nodes have none) and a node
	// that exists; a refused one marks nothing.
	if _, errOut, code := a.CLI("", "node", "drain", "node-b"); code == 0 || !strings.Contains(errOut, "no object store") {
		t.Fatalf("node drain without an object store: %d %q", code, errOut)
	}
	if _, errOut, code := a.CLI("", "node", "drain", "nope"); code == 0 || !strings.Contains(errOut, `no node "nope"`) {
		t.Fatalf("node drain of an unknown node: %d %q", code, errOut)
	}
	if ns, err := a.Client.ListNodes(ctx); err != nil || ns[0].Draining || ns[1].Draining {
		t.Fatalf("nodes after refused drains: %+v %v", ns, err)
	}
	clusterAntiAffinity(t, ctx, a, b, onA, onB)
	out, _, code = b.CLI("", "ls")
	if code != 0 || !strings.Contains(out, "NODE") || !strings.Contains(out, "node-a") || !strings.Contains(out, "node-b") {
		t.Fatalf("agentvm ls on node b:\n%s", out)
	}
	if r := a.Exec(ctx, onA, "echo here"); strings.TrimSpace(r.Stdout) != "here" {
		t.Fatalf("exec on its own node: %+v", r)
	}
	var ae *client.APIError
	clusterRouting(t, ctx, a, b, nodes, onA, onB)

	// The database stops answering: both nodes fence themselves.
	if err := pg.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			pg.Thaw()
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); len(testenv.QEMUProcesses(va.ID))+len(testenv.QEMUProcesses(vb.ID)) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the nodes' VMs still run with the database gone:\n%s\n%s", a.Logs(), b.Logs())
		}
	}
	if _, err := a.Client.Exec(ctx, onA, api.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, "back in the cluster") {
		t.Fatalf("exec on a fenced node: %v", err)
	}
	if err := pg.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	// Both join again, and the fence's VMs are recorded crashed.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		nodes, err := a.Client.ListNodes(ctx)
		ok := err == nil && len(nodes) == 2
		for _, n := range nodes {
			ok = ok && n.Alive && n.Generation == 2
		}
		got, gerr := a.Client.GetVM(ctx, onA)
		if ok && gerr == nil && got.State == api.StateCrashed {
			if !strings.Contains(got.Error, "fence") {
				t.Fatalf("on-a after the fence: %+v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the database came back: %+v %v; on-a %+v %v\n%s", nodes, err, got, gerr, a.Logs())
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, err := b.Client.GetVM(ctx, onB)
		if err == nil && got.State == api.StateCrashed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("on-b after the database came back: %+v %v", got, err)
		}
	}
	vc := a.CreateVM(ctx, api.CreateVMRequest{Name: "after"})
	if r := a.Exec(ctx, vc.ID, "echo back"); strings.TrimSpace(r.Stdout) != "back" {
		t.Fatalf("exec after the rejoin: %+v", r)
	}
	if err := a.Client.DeleteVM(ctx, vc.ID); err != nil {
		t.Fatal(err)
	}

	// A node that stops leaves the cluster at once.
	b.Terminate()
	nodes, err = a.Client.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == "node-b" && n.Alive {
			t.Fatalf("node-b after it stopped: %+v", n)
		}
	}
	// Its VMs are shown lost: they run nowhere, and a request about one
	// is answered by the node asked, not forwarded.
	if _, err := a.Client.Exec(ctx, onB, api.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != 421 || ae.Code != api.CodeOtherNode {
		t.Fatalf("exec in a VM of a node that left: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, err := a.Client.GetVM(ctx, onB)
		if err == nil && got.NodeLost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("on-b after node-b left: %+v %v", got, err)
		}
	}
	if out, _, _ := a.CLI("", "ls"); !strings.Contains(out, "lost (was crashed)") {
		t.Fatalf("agentvm ls after node-b left:\n%s", out)
	}
	// The lost node cannot be removed while VMs are recorded on it; its
	// VMs can be deleted (forgotten: they run nowhere), then it can.
	if _, errOut, code := a.CLI("", "node", "rm", "node-b"); code == 0 || !strings.Contains(errOut, "VMs are recorded") {
		t.Fatalf("node rm of a node with VMs: %d %q", code, errOut)
	}
	if err := a.Client.DeleteVM(ctx, onB); err != nil {
		t.Fatalf("delete a lost node's VM: %v", err)
	}
	if _, err := a.Client.GetVM(ctx, onB); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("the lost node's VM after its delete: %v", err)
	}
	if out, errOut, code := a.CLI("", "node", "rm", "node-b"); code != 0 {
		t.Fatalf("node rm of a lost node without VMs: %d %q %q", code, out, errOut)
	}
	for _, name := range []string{onA} {
		if err := a.Client.DeleteVM(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
}

// clusterRouting drives node b's VM onB through node a: exec (buffered
// and upgraded), a terminal, files both ways, lifecycle, a scoped token and its
// revocation, a preview; a token cannot name another caller; the peer
// listener refuses anyone without a node certificate.
func clusterRouting(t *testing.T, ctx context.Context, a, b *testenv.Server, nodes []api.Node, onA, onB string) {
	t.Helper()
	if r := a.Exec(ctx, onB, "hostname; echo via-a"); !strings.Contains(r.Stdout, "via-a") {
		t.Fatalf("exec in node b's VM through node a: %+v", r)
	}
	var out bytes.Buffer
	st, err := a.Client.Run(ctx, onB, api.ExecRequest{Cmd: []string{"sh", "-c", "cat; echo done"}}, strings.NewReader("streamed\n"), &out, io.Discard)
	if err != nil || st.ExitCode != 0 || out.String() != "streamed\ndone\n" {
		t.Fatalf("upgraded exec through node a: %+v %v %q", st, err, out.String())
	}
	// A terminal made and used through node a lives on node b: its
	// scrollback is there for a client of node b.
	if _, err := a.Client.CreateTerminal(ctx, onB, api.TermCreate{Name: "via-a", Cols: 100, Rows: 30}); err != nil {
		t.Fatalf("terminal through node a: %v", err)
	}
	tr := attach(t, a.Client, onB, "via-a", client.AttachOptions{})
	tr.send("echo term-$((6*7))-$(hostname)\n")
	tr.waitFor("term-42-"+onB, time.Minute)
	tr.close()
	tb := attach(t, b.Client, onB, "via-a", client.AttachOptions{})
	tb.waitFor("term-42-"+onB, time.Minute)
	tb.close()
	payload := bytes.Repeat([]byte("cluster-routing "), 64<<10) // 1 MiB
	if _, err := a.Client.WriteFile(ctx, onB, "/root/payload", bytes.NewReader(payload), int64(len(payload)), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := b.Exec(ctx, onB, "sha256sum /root/payload | cut -c1-64"); strings.TrimSpace(r.Stdout) != fmt.Sprintf("%x", sha256.Sum256(payload)) {
		t.Fatalf("the file written through node a, read on node b: %+v", r)
	}
	rc, _, err := a.Client.ReadFile(ctx, onB, "/root/payload", 0, -1, client.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("read back through node a: %d bytes, %v", len(got), err)
	}
	if v, err := a.Client.PauseVM(ctx, onB); err != nil || v.State != api.StatePaused || v.Node != "node-b" {
		t.Fatalf("pause through node a: %+v %v", v, err)
	}
	if v, err := b.Client.GetVM(ctx, onB); err != nil || v.State != api.StatePaused {
		t.Fatalf("node b's view after the pause: %+v %v", v, err)
	}
	if v, err := a.Client.ResumeVM(ctx, onB); err != nil || v.State != api.StateRunning {
		t.Fatalf("resume through node a: %+v %v", v, err)
	}

	// A snapshot of node b's VM is kept on node b: a create from it sent to
	// node a is made there, and its delete sent to node a is done there.
	if _, err := a.Client.Snapshot(ctx, onB, "snap-b"); err != nil {
		t.Fatalf("snapshot through node a: %v", err)
	}
	if v, err := a.Client.CreateVM(ctx, api.CreateVMRequest{Name: "from-b", From: "snap-b"}); err != nil || v.Node != "node-b" {
		t.Fatalf("create from node b's snapshot through node a: %+v %v", v, err)
	}
	if err := a.Client.DeleteVM(ctx, "from-b"); err != nil {
		t.Fatal(err)
	}
	if err := a.Client.DeleteSnapshot(ctx, "snap-b"); err != nil {
		t.Fatalf("delete node b's snapshot through node a: %v", err)
	}

	// A scoped token works through either node and stops at its revoke.
	tok, err := a.Client.CreateToken(ctx, api.CreateTokenRequest{VM: onB, Allow: []string{api.PermExec}})
	if err != nil {
		t.Fatal(err)
	}
	scoped := client.New(a.URL, tok.Secret)
	if res, err := scoped.Exec(ctx, onB, api.ExecRequest{Cmd: []string{"echo", "scoped"}}); err != nil || strings.TrimSpace(res.Stdout) != "scoped" {
		t.Fatalf("scoped token through node a: %+v %v", res, err)
	}
	var ae *client.APIError
	if _, err := scoped.PauseVM(ctx, onB); !errors.As(err, &ae) || ae.Status != 403 {
		t.Fatalf("a scoped exec token paused a VM through node a: %v", err)
	}
	// A token of a VM on node a cannot pass for the admin on node b.
	tokA, err := a.Client.CreateToken(ctx, api.CreateTokenRequest{VM: onA, Allow: []string{api.PermExec}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", a.URL+"/v1/vms/"+onB+"/exec", strings.NewReader(`{"cmd":["true"]}`))
	req.Header.Set("Authorization", "Bearer "+tokA.Secret)
	req.Header.Set("Agentvm-Principal", "admin")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Fatalf("a token of another VM naming itself the admin: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := a.Client.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := scoped.Exec(ctx, onB, api.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("a revoked token through node a: %v", err)
	}

	// One admin credential for the cluster: an admin token made on node a
	// (the CLI) is the admin on node b too, and ends there at its revoke.
	admOut, errOut, code := a.CLI("", "token", "create", "--admin", "--name", "lb", "--json")
	var adm api.Token
	if code != 0 || json.Unmarshal([]byte(admOut), &adm) != nil || adm.Secret == "" {
		t.Fatalf("token create --admin: %d %s %s", code, admOut, errOut)
	}
	onB2 := client.New(b.URL, adm.Secret)
	if vms, err := onB2.ListVMs(ctx); err != nil || len(vms) < 2 {
		t.Fatalf("node a's admin token on node b: %v %d VMs", err, len(vms))
	}
	if res, err := onB2.Exec(ctx, onA, api.ExecRequest{Cmd: []string{"echo", "admin"}}); err != nil || strings.TrimSpace(res.Stdout) != "admin" {
		t.Fatalf("node a's admin token through node b on node a's VM: %+v %v", res, err)
	}
	if _, errOut, code := a.CLI("", "token", "rm", adm.ID); code != 0 {
		t.Fatalf("token rm: %s", errOut)
	}
	if _, err := onB2.ListVMs(ctx); !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("a revoked admin token on node b: %v", err)
	}

	// A preview of node b's VM through node a's proxy: the caller's token
	// is checked by node a, the app answers from node b.
	startWebServer(t, b, onB)
	h, err := a.Client.Health(ctx)
	if err != nil || h.Proxy == "" {
		t.Fatalf("health of node a: %+v %v", h, err)
	}
	pv := &previewEnv{t: t, s: a, proxy: h.Proxy, domain: h.Domain}
	if resp, body := pv.do("GET", pv.host(8000, onB), "/x", nil, map[string]string{"Authorization": "Bearer " + a.Token}); resp.StatusCode != 200 || body != "hello from HTTP/1.1 /x\n" {
		t.Fatalf("preview of node b's VM through node a: %d %q", resp.StatusCode, body)
	}
	if resp, body := pv.do("GET", pv.host(8000, onB), "/x", nil, nil); resp.StatusCode != 401 {
		t.Fatalf("private preview through node a without a token: %d %q", resp.StatusCode, body)
	}

	phase := time.Now()
	clusterSSH(t, ctx, a, b, onB)
	t.Logf("ssh through node a: %.1f s", time.Since(phase).Seconds())
	phase = time.Now()
	clusterE2B(t, ctx, a, b)
	t.Logf("e2b through node a: %.1f s", time.Since(phase).Seconds())

	// A client cannot pass its API request off as a forwarded preview
	// (which the owner's proxy would serve without checking a token).
	req, _ = http.NewRequestWithContext(ctx, "GET", a.URL+"/v1/vms/"+onB, nil)
	req.Header.Set("Authorization", "Bearer "+tokA.Secret)
	req.Header.Set("Agentvm-Preview", "1")
	req.Host = pv.host(8000, onB)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || strings.Contains(string(b), "hello from") {
			t.Fatalf("a token of another VM with a preview header: %d %q", resp.StatusCode, b)
		}
	}

	// A revoke through node a ends the token's streams through node a, and
	// on node b itself (node b hears of it from the database).
	revokeEndsStream(t, ctx, a, a, b, onB, "/tmp/revoke-via-a")
	revokeEndsStream(t, ctx, a, b, b, onB, "/tmp/revoke-on-b")

	// The peer listener: TLS that needs a node certificate of this cluster.
	var peer string
	for _, n := range nodes {
		if n.Name == "node-b" {
			peer = n.PeerAddress
		}
	}
	if peer == "" {
		t.Fatalf("node-b has no peer address: %+v", nodes)
	}
	anon := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := anon.Get("https://" + peer + "/v1/vms/" + onB); err == nil {
		resp.Body.Close()
		t.Fatalf("the peer listener answered a client without a certificate: %s", resp.Status)
	}
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + peer + "/v1/vms/" + onB); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "HTTPS server") {
			t.Fatalf("the peer listener answered plain HTTP: %s %q", resp.Status, b)
		}
	}
}

// revokeEndsStream opens a stream (an exec of sleep) in VM vm of node owner
// with a new exec token through node streamVia, waits until it runs, revokes
// the token through node revokeVia, and fails unless the stream ends.
func revokeEndsStream(t *testing.T, ctx context.Context, revokeVia, streamVia, owner *testenv.Server, vm, marker string) {
	t.Helper()
	tok, err := revokeVia.Client.CreateToken(ctx, api.CreateTokenRequest{VM: vm, Allow: []string{api.PermExec}})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() {
		_, err := client.New(streamVia.URL, tok.Secret).Run(ctx, vm, api.ExecRequest{Cmd: []string{"sh", "-c", "echo started > " + marker + "; sleep 600"}}, nil, io.Discard, io.Discard)
		ran <- err
	}()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if r := owner.Exec(ctx, vm, "cat "+marker+" 2>/dev/null || true"); strings.Contains(r.Stdout, "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream through %s did not start", streamVia.URL)
		}
	}
	if err := revokeVia.Client.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(2 * time.Minute):
		t.Fatalf("a stream through %s outlived its token's revoke through %s", streamVia.URL, revokeVia.URL)
	}
}

// clusterAntiAffinity makes the node that holds a VM labelled team=red the
// roomier one, then creates another team=red VM with anti-affinity on
// team: it goes to the other node, against the memory spread.
func clusterAntiAffinity(t *testing.T, ctx context.Context, a, b *testenv.Server, onA, onB string) {
	t.Helper()
	var ae *client.APIError
	if _, err := a.Client.CreateVM(ctx, api.CreateVMRequest{Name: "no-label", Memory: 512 << 20, AntiAffinity: "team"}); !errors.As(err, &ae) || ae.Status != 400 {
		t.Fatalf("anti_affinity naming a label the VM does not have: %v", err)
	}
	red := map[string]string{"team": "red"}
	r1 := a.CreateVM(ctx, api.CreateVMRequest{Name: "red-1", Labels: red, AntiAffinity: "team"})
	other, base := "node-b", onA // base: the VM that shares red-1's node
	if r1.Node == "node-b" {
		other, base = "node-a", onB
	}
	// red-1's node holds two VMs, the other one: the next create goes there.
	if f := a.CreateVM(ctx, api.CreateVMRequest{Name: "filler"}); f.Node != other {
		t.Fatalf("a create with %s the roomier node went to %s", other, f.Node)
	}
	// Suspended, red-1's neighbour holds no memory: red-1's node is now the
	// roomier one (one VM against two).
	if _, err := a.Client.SuspendVM(ctx, base); err != nil {
		t.Fatal(err)
	}
	if r2 := a.CreateVM(ctx, api.CreateVMRequest{Name: "red-2", Labels: red, AntiAffinity: "team"}); r2.Node != other {
		t.Fatalf("red-2 with anti-affinity on team went to %s, where red-1 runs, not to %s", r2.Node, other)
	}
	for _, name := range []string{"red-1", "red-2", "filler"} {
		if err := a.Client.DeleteVM(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Client.WakeVM(ctx, base); err != nil {
		t.Fatal(err)
	}
}
