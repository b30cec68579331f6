package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/pkg/client"
)

// Two daemons as nodes of one cluster on a real PostgreSQL: both join and
// list each other with their capacity and QEMU; each runs the VMs made
// through it, lists the other's with their node, and answers an operation
// on the other's VM with 421 other_node. When the database stops answering
// (its processes frozen, as in a network partition) each node kills its
// VMs before its lease can run out; when it answers again they join again
// with a new generation, the killed VMs are recorded crashed with the
// reason, and operations work again. A node that stops leaves at once, and
// its VMs are shown lost.
func TestClusterNodes(t *testing.T) {
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

	va := a.CreateVM(ctx, api.CreateVMRequest{Name: "on-a"})
	vb := b.CreateVM(ctx, api.CreateVMRequest{Name: "on-b"})
	if va.Node != "node-a" || vb.Node != "node-b" {
		t.Fatalf("nodes of the VMs: %q %q", va.Node, vb.Node)
	}
	out, _, code = b.CLI("", "ls")
	if code != 0 || !strings.Contains(out, "NODE") || !strings.Contains(out, "node-a") || !strings.Contains(out, "node-b") {
		t.Fatalf("agentvm ls on node b:\n%s", out)
	}
	if r := a.Exec(ctx, "on-a", "echo here"); strings.TrimSpace(r.Stdout) != "here" {
		t.Fatalf("exec on its own node: %+v", r)
	}
	var ae *client.APIError
	if _, err := a.Client.Exec(ctx, "on-b", api.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != 421 || ae.Code != api.CodeOtherNode {
		t.Fatalf("exec in the other node's VM: %v", err)
	}

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
	if _, err := a.Client.Exec(ctx, "on-a", api.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != 503 || !strings.Contains(ae.Message, "back in the cluster") {
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
		got, gerr := a.Client.GetVM(ctx, "on-a")
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
		got, err := b.Client.GetVM(ctx, "on-b")
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
	// Its VMs are shown lost: they run nowhere.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, err := a.Client.GetVM(ctx, "on-b")
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
	for _, name := range []string{"on-a", "after"} {
		if err := a.Client.DeleteVM(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
}
