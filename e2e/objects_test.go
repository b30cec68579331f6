package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/s3test"
	"github.com/agentvm/agentvm/pkg/client"
)

// Two cluster nodes keep snapshots in a real S3 server (Versity's
// gateway). A snapshot taken on one node is stored (its manifest and
// chunks are in the bucket); the node is killed with its VMs, as when its
// host dies; through the other node, the snapshot's create comes back
// there from the object store with its running counter and a checksummed
// file intact. A damaged chunk, or a manifest changed in the bucket, makes
// the create fail with a clear error and leaves nothing behind; the create
// works once they are whole again, and a second one uses what was fetched.
func TestClusterObjects(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	s3 := s3test.StartT(t)
	pg := pgtest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	objs := s3.URL("cluster")
	a := testenv.StartEnv(t, s3.Environ(), "", "--store", dsn, "--cluster", "--node-name", "node-a", "--lease", "6s", "--objects", objs)
	b := testenv.StartEnv(t, s3.Environ(), "", "--store", dsn, "--cluster", "--node-name", "node-b", "--lease", "6s", "--objects", objs)

	v := a.CreateVM(ctx, api.CreateVMRequest{Name: "origin"})
	origin, other := a, b
	if v.Node == "node-b" {
		origin, other = b, a
	}
	r := a.Exec(ctx, v.ID, `head -c 12M /dev/urandom > /root/data.bin && sha256sum /root/data.bin | cut -d' ' -f1 &&
nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.2; done' >/dev/null 2>&1 &
for i in $(seq 300); do [ -s /tmp/counter ] && break; sleep 0.2; done; cat /tmp/counter`)
	lines := strings.Fields(r.Stdout)
	if r.ExitCode != 0 || len(lines) != 2 {
		t.Fatalf("setup: %+v", r)
	}
	sum := lines[0]
	sn, err := a.Client.Snapshot(ctx, v.ID, "stored")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Node != v.Node {
		t.Fatalf("snapshot's node %q, VM's %q", sn.Node, v.Node)
	}
	// Its node stores it in the background; stored_at says when it is all there.
	storing := time.Now()
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		got, err := b.Client.GetSnapshot(ctx, sn.ID)
		if err == nil && got.StoredAt != nil {
			t.Logf("snapshot stored %.1f s after it was taken", time.Since(storing).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot not stored: %+v %v\n%s", got, err, origin.Logs())
		}
	}
	manifest := filepath.Join(s3.Root, s3.Bucket, "cluster", "manifests", "snapshots", sn.ID+".json")
	var m struct {
		State struct{ Chunks []string } `json:"state"`
		Chain []struct{ Chunks []string }
	}
	if raw, err := os.ReadFile(manifest); err != nil || json.Unmarshal(raw, &m) != nil || len(m.Chain) < 2 {
		t.Fatalf("manifest in the bucket: %v %+v", err, m)
	}

	// A running VM on the same node (made from the snapshot, so it runs
	// there and counts on) is snapshotted in turn; that snapshot is stored.
	runner := a.CreateVM(ctx, api.CreateVMRequest{Name: "runner", From: sn.ID})
	if runner.Node != v.Node {
		t.Fatalf("a VM made from the snapshot went to %q, not its node %q", runner.Node, v.Node)
	}
	if r := a.Exec(ctx, runner.ID, "echo runner-was-here > /root/mark"); r.ExitCode != 0 {
		t.Fatalf("runner: %+v", r)
	}
	rsn, err := a.Client.Snapshot(ctx, runner.ID, "runner-snap")
	if err != nil {
		t.Fatal(err)
	}
	if r := a.Exec(ctx, runner.ID, "echo after-the-snapshot > /root/mark"); r.ExitCode != 0 { // lost with the node
		t.Fatalf("runner: %+v", r)
	}
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		got, err := b.Client.GetSnapshot(ctx, rsn.ID)
		if err == nil && got.StoredAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the running VM's snapshot not stored: %+v %v\n%s", got, err, origin.Logs())
		}
	}

	// The VM is suspended; its node stores that state too.
	storing = time.Now()
	if _, err := a.Client.SuspendVM(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		got, err := b.Client.GetVM(ctx, v.ID)
		if err == nil && got.StoredAt != nil && got.State == api.StateSuspended {
			t.Logf("suspended VM stored %.1f s after the suspend", time.Since(storing).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("suspended VM not stored: %+v %v\n%s", got, err, origin.Logs())
		}
	}

	// The snapshot's node dies with its VMs.
	origin.Kill9()
	// (The running VM's QEMU runs on, cut off, as after a daemon crash:
	// the node kills it when it comes back, at the end.)
	oldRunner := testenv.QEMUProcesses(runner.ID)
	if len(oldRunner) != 1 {
		t.Fatalf("the running VM's QEMUs on the node about to die: %v", oldRunner)
	}
	for _, pid := range testenv.QEMUProcesses(v.ID) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		nodes, err := other.Client.ListNodes(ctx)
		alive := 0
		for _, n := range nodes {
			if n.Alive {
				alive++
			}
		}
		if err == nil && alive == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed node is still alive: %+v %v", nodes, err)
		}
	}

	// A chunk only the memory state has is truncated in the bucket: the
	// create fails and says so, and leaves no VM.
	var chunk string
	for _, c := range m.State.Chunks {
		inChain := false
		for _, f := range m.Chain {
			inChain = inChain || slices.Contains(f.Chunks, c)
		}
		if c != "" && !inChain {
			chunk = filepath.Join(s3.Root, s3.Bucket, "cluster", "chunks", c[:2], c)
			break
		}
	}
	good, err := os.ReadFile(chunk)
	if err != nil {
		t.Fatalf("a chunk of the state: %v", err)
	}
	if err := os.WriteFile(chunk, good[:len(good)/3], 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := other.Client.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ae *client.APIError
	_, err = other.Client.CreateVM(ctx, api.CreateVMRequest{Name: "from-damaged", From: sn.ID})
	if !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, "damaged") {
		t.Fatalf("create from a snapshot with a damaged chunk: %v", err)
	}
	if after, err := other.Client.ListVMs(ctx); err != nil || len(after) != len(before) {
		t.Fatalf("a failed create left a VM: %d VMs before, %d after (%v)", len(before), len(after), err)
	}
	if parts, _ := filepath.Glob(filepath.Join(other.DataDir, "objects", "*.fetch*")); len(parts) > 0 {
		t.Fatalf("a failed fetch left %v", parts)
	}
	if err := os.WriteFile(chunk, good, 0o644); err != nil {
		t.Fatal(err)
	}
	// A manifest changed in the bucket (one byte more) is refused: the
	// database holds the hash of the one that was stored.
	raw, _ := os.ReadFile(manifest)
	if err := os.WriteFile(manifest, append(raw, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = other.Client.CreateVM(ctx, api.CreateVMRequest{Name: "from-altered", From: sn.ID})
	if !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, "altered or replaced") {
		t.Fatalf("create from a snapshot whose manifest was altered: %v", err)
	}
	if err := os.WriteFile(manifest, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	// A node with another QEMU joins (the distribution's, when the suite
	// runs on another): it is the roomiest node, with no VM, but it cannot
	// load the snapshot's state, so it is never chosen for it, nor as the
	// drain's target below.
	var older *testenv.Server
	if ov, _ := qemuVersion("qemu-system-x86_64"); os.Getenv("AGENTVM_QEMU") != "" {
		if nv, _ := qemuVersion(os.Getenv("AGENTVM_QEMU")); ov != "" && nv != "" && ov != nv {
			older = testenv.StartEnv(t, s3.Environ(), "", "--store", dsn, "--cluster", "--node-name", "node-old", "--lease", "6s", "--objects", objs, "--qemu", "qemu-system-x86_64")
			if ns, err := older.Client.ListNodes(ctx); err != nil || !slices.ContainsFunc(ns, func(n api.Node) bool { return n.Name == "node-old" && n.QEMUVersion == ov }) {
				t.Fatalf("the node with QEMU %s: %+v %v", ov, ns, err)
			}
		}
	}
	if older == nil {
		t.Log("one QEMU version here: the mixed-version node is left out")
	}

	// Whole again, the snapshot comes back on the living node, its counter
	// still counting and its file intact.
	fetching := time.Now()
	c := other.CreateVM(ctx, api.CreateVMRequest{Name: "restored", From: sn.ID})
	t.Logf("create from the stored snapshot on the other node (fetch and restore): %.1f s", time.Since(fetching).Seconds())
	if c.Node == v.Node || c.Node == "node-old" {
		t.Fatalf("restored on node %q (the dead node is %q, node-old runs another QEMU)", c.Node, v.Node)
	}
	if older != nil { // sent to the node that cannot load it, it goes to one that can
		e := older.CreateVM(ctx, api.CreateVMRequest{Name: "via-old", From: sn.ID})
		if e.Node == "node-old" || e.Node == v.Node {
			t.Fatalf("a create from the snapshot sent to node-old went to %q", e.Node)
		}
		if err := older.Client.DeleteVM(ctx, e.ID); err != nil {
			t.Fatal(err)
		}
	}
	r = other.Exec(ctx, c.ID, `sha256sum /root/data.bin | cut -d' ' -f1; a=$(cat /tmp/counter); sleep 1; echo $a $(cat /tmp/counter)`)
	f := strings.Fields(r.Stdout)
	if r.ExitCode != 0 || len(f) != 3 || f[0] != sum {
		t.Fatalf("restored VM: %+v (file's sum was %s)", r, sum)
	}
	n1, _ := strconv.Atoi(f[1])
	n2, _ := strconv.Atoi(f[2])
	at, _ := strconv.Atoi(lines[1])
	if n1 < at || n2 <= n1 {
		t.Fatalf("counter: %d at the snapshot, then %d and %d a second later: not counting on", at, n1, n2)
	}
	// A second create from it uses what the node fetched.
	again := time.Now()
	d := other.CreateVM(ctx, api.CreateVMRequest{Name: "restored-2", From: sn.ID})
	t.Logf("a second create from it (fetched files cached): %.1f s", time.Since(again).Seconds())
	if r := other.Exec(ctx, d.ID, "sha256sum /root/data.bin | cut -d' ' -f1"); strings.TrimSpace(r.Stdout) != sum {
		t.Fatalf("second restore: %+v", r)
	}
	if logs := other.Logs(); strings.Count(logs, "snapshot fetched") != 1 || !strings.Contains(logs, "snapshot found fetched before") {
		t.Fatalf("want one fetch, then a create from what it fetched:\n%s", logs)
	}
	// The lost node's suspended VM is listed with its stored state; an
	// exec through the living node takes it over and wakes it there, its
	// counter counting on from where it was and its file intact.
	out, _, _ := other.CLI("", "ls")
	if !strings.Contains(out, "lost (was suspended, stored") || !strings.Contains(out, "lost (was running: comes back on another node from snapshot runner-snap") {
		t.Fatalf("agentvm ls with a lost node's stored VM and running VM:\n%s", out)
	}
	// The lost node's running VM comes back from its stored snapshot, with
	// its id and name, counting on, and its file as it was at the snapshot.
	reviving := time.Now()
	r = other.Exec(ctx, runner.ID, `cat /root/mark; sha256sum /root/data.bin | cut -d' ' -f1; a=$(cat /tmp/counter); sleep 1; echo $a $(cat /tmp/counter); hostname`)
	t.Logf("exec that revived the lost node's running VM from its snapshot: %.1f s", time.Since(reviving).Seconds())
	if g := strings.Fields(r.Stdout); r.ExitCode != 0 || len(g) != 5 || g[0] != "runner-was-here" || g[1] != sum || g[2] == g[3] || g[4] != "runner" {
		t.Fatalf("the revived VM: %+v", r)
	}
	got, err := other.Client.GetVM(ctx, runner.ID)
	if err != nil || got.Node == v.Node || got.NodeLost || got.State != api.StateRunning || got.Name != "runner" || slices.Contains(oldRunner, got.PID) {
		t.Fatalf("the revived VM's record: %+v %v (its QEMU on the dead node: %v)", got, err, oldRunner)
	}
	if pids := testenv.QEMUProcesses(runner.ID); len(pids) != 1+len(oldRunner) || !slices.Contains(pids, got.PID) {
		t.Fatalf("the revived VM's QEMUs: %v, want its new one %d and the dead node's %v", pids, got.PID, oldRunner)
	}
	// Two execs at once, as an agent's parallel tool calls: one takeover,
	// one fetch, one wake; both run in the same VM.
	moving := time.Now()
	hostnames := make(chan string, 1)
	go func() {
		res, err := other.Client.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "cat /etc/machine-id; echo $(cat /tmp/counter)"}})
		if err != nil {
			hostnames <- "error: " + err.Error()
			return
		}
		hostnames <- res.Stdout
	}()
	r = other.Exec(ctx, v.ID, `sha256sum /root/data.bin | cut -d' ' -f1; a=$(cat /tmp/counter); sleep 1; echo $a $(cat /tmp/counter)`)
	t.Logf("exec that took the lost node's suspended VM over (fetch and wake): %.1f s", time.Since(moving).Seconds())
	if h := <-hostnames; strings.HasPrefix(h, "error") || len(strings.Fields(h)) != 2 {
		t.Fatalf("the concurrent exec in the taken-over VM: %q", h)
	}
	if n := strings.Count(other.Logs(), "suspended VM fetched"); n != 1 {
		t.Fatalf("the taken-over VM was fetched %d times, want once", n)
	}
	if pids := testenv.QEMUProcesses(v.ID); len(pids) != 1 {
		t.Fatalf("the taken-over VM runs in %d QEMUs, want one: %v", len(pids), pids)
	}
	f = strings.Fields(r.Stdout)
	if r.ExitCode != 0 || len(f) != 3 || f[0] != sum {
		t.Fatalf("moved VM: %+v (file's sum was %s)", r, sum)
	}
	n1, _ = strconv.Atoi(f[1])
	n2, _ = strconv.Atoi(f[2])
	if n1 < at || n2 <= n1 {
		t.Fatalf("moved VM's counter: %d at the snapshot, then %d and %d a second later", at, n1, n2)
	}
	if got, err := other.Client.GetVM(ctx, v.ID); err != nil || got.Node == v.Node || got.NodeLost || got.State != api.StateRunning || got.StoredAt != nil {
		t.Fatalf("the moved VM: %+v %v", got, err)
	}
	// Its stored state, consumed by the wake, is gone from the bucket.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(s3.Root, s3.Bucket, "cluster", "manifests", "vms", v.ID, "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a woken VM's stored state is still in the bucket: %v", left)
		}
	}

	// The dead node comes back: it kills its own QEMU of the VM another
	// node revived meanwhile, which ran on cut off; the VM runs once. Then
	// it dies again, for the rest of the test.
	if !slices.Contains(testenv.QEMUProcesses(runner.ID), oldRunner[0]) {
		t.Fatalf("the dead node's QEMU of the revived VM is gone before its node came back: %v", testenv.QEMUProcesses(runner.ID))
	}
	origin.Restart()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if pids := testenv.QEMUProcesses(runner.ID); len(pids) == 1 && pids[0] == got.PID {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the revived VM's QEMUs after its old node came back: %v, want only %d\n%s", pids, got.PID, origin.Logs())
		}
	}
	if r := other.Exec(ctx, runner.ID, "cat /root/mark"); strings.TrimSpace(r.Stdout) != "runner-was-here" {
		t.Fatalf("the revived VM after its old node came back: %+v", r)
	}
	origin.Kill9()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		nodes, err := other.Client.ListNodes(ctx)
		if err == nil && !slices.ContainsFunc(nodes, func(n api.Node) bool { return n.Name == v.Node && n.Alive }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node killed again is still alive: %+v %v", nodes, err)
		}
	}

	// Deleting the snapshot (its node is lost) removes its manifest.
	if err := other.Client.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(manifest); !os.IsNotExist(err) {
		t.Fatalf("the manifest of a deleted snapshot: %v", err)
	}

	// A third node joins; the living node is drained: its VMs (two made
	// from the snapshot, the one it took over and the one it revived, all
	// running) move to the new node and run there, the taken-over VM's counter counting on;
	// new VMs go to the new node.
	c3 := testenv.StartEnv(t, s3.Environ(), "", "--store", dsn, "--cluster", "--node-name", "node-c", "--lease", "6s", "--objects", objs)
	otherName := "node-a"
	if v.Node == "node-a" {
		otherName = "node-b"
	}
	before = nil
	draining := time.Now()
	out, errOut, code := c3.CLI("", "node", "drain", otherName)
	t.Logf("drain of 4 running VMs: %.1f s", time.Since(draining).Seconds())
	if code != 0 || strings.Count(out, "moved to node-c (running)") != 4 {
		t.Fatalf("agentvm node drain %s: %d\n%s\n%s\n%s", otherName, code, out, errOut, other.Logs())
	}
	for _, id := range []string{c.ID, d.ID, v.ID, runner.ID} {
		got, err := c3.Client.GetVM(ctx, id)
		if err != nil || got.Node != "node-c" || got.State != api.StateRunning {
			t.Fatalf("a drained VM: %+v %v", got, err)
		}
	}
	r = c3.Exec(ctx, v.ID, `sha256sum /root/data.bin | cut -d' ' -f1; cat /tmp/counter; sleep 1; cat /tmp/counter`)
	g := strings.Fields(r.Stdout)
	if r.ExitCode != 0 || len(g) != 3 || g[0] != sum {
		t.Fatalf("the drained VM: %+v", r)
	}
	if m1, _ := strconv.Atoi(g[1]); m1 < n2 {
		t.Fatalf("the drained VM's counter went back: %d before the drain, %d after", n2, m1)
	}
	if m1, _ := strconv.Atoi(g[1]); strings.TrimSpace(g[2]) == strconv.Itoa(m1) {
		t.Fatalf("the drained VM's counter stopped: %v", g)
	}
	if out, _, _ := c3.CLI("", "node", "ls"); !strings.Contains(out, "draining") {
		t.Fatalf("agentvm node ls during a drain:\n%s", out)
	}
	if older != nil { // a plain create may go to any node: node-old leaves first
		older.Terminate()
	}
	if nv := other.CreateVM(ctx, api.CreateVMRequest{Name: "after-drain"}); nv.Node != "node-c" {
		t.Fatalf("a create after the drain went to %s", nv.Node)
	}
}
