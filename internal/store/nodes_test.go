package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// Nodes on PostgreSQL: joins count generations, a lease is renewed only by
// its generation and runs out by the database's clock, names are unique,
// only a node whose lease ran out can be removed, and VMs carry their node.
func TestNodes(t *testing.T) {
	s, err := Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	a := &Node{ID: "node-a-id", Name: "a", Address: "10.0.0.1:8080", CPUs: 8, MemoryMiB: 16384, QEMUVersion: "10.0.2", MachineType: "pc-q35-7.2", CPUModel: "max", Accel: "kvm"}
	ja, err := s.JoinNode(ctx, a, time.Minute)
	if err != nil || ja.Generation != 1 || !ja.Alive {
		t.Fatalf("join: %+v %v", ja, err)
	}
	if _, err := s.JoinNode(ctx, &Node{ID: "node-b-id", Name: "a"}, time.Minute); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second node named a: %v", err)
	}
	if err := s.SetDraining(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RenewLease(ctx, a.ID, 1, time.Minute); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if n, _ := s.GetNode(ctx, a.ID); n == nil || !n.Draining {
		t.Fatalf("a renewal ended the drain: %+v", n)
	}
	ja2, err := s.JoinNode(ctx, a, time.Minute) // a restart of the node
	if err != nil || ja2.Generation != 2 {
		t.Fatalf("join again: %+v %v", ja2, err)
	}
	if n, _ := s.GetNode(ctx, a.ID); n == nil || n.Draining {
		t.Fatalf("a restart did not end the drain: %+v", n)
	}
	if _, err := s.RenewLease(ctx, a.ID, 1, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a renewal by the old generation: %v", err)
	}
	if err := s.RemoveNode(ctx, "a"); !errors.Is(err, ErrConflict) {
		t.Fatalf("removing a live node: %v", err)
	}
	// A short lease runs out on its own.
	b := &Node{ID: "node-b-id", Name: "b", Address: "10.0.0.2:8080", CPUs: 2, MemoryMiB: 4096}
	if _, err := s.JoinNode(ctx, b, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := s.GetNode(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		if !n.Alive {
			if n.LeaseLeft > 0 || n.Generation != 1 || n.CPUs != 2 || n.Address != "10.0.0.2:8080" {
				t.Fatalf("expired node: %+v", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's half-second lease never ran out")
		}
	}
	if _, err := s.RenewLease(ctx, b.ID, 1, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewal of a lease that ran out: %v", err)
	}
	ns, err := s.ListNodes(ctx)
	if err != nil || len(ns) != 2 || ns[0].Name != "a" || !ns[0].Alive || ns[0].QEMUVersion != "10.0.2" || ns[1].Alive {
		t.Fatalf("list: %+v %v", ns, err)
	}
	if err := s.LeaveNode(ctx, a.ID, 2); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.GetNode(ctx, a.ID); n.Alive {
		t.Fatal("a is alive after leaving")
	}
	if err := s.RemoveNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetNode(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed node: %v", err)
	}
	if _, err := s.RenewLease(ctx, b.ID, 1, time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewal of a removed node: %v", err)
	}
	// A VM's node is a column too.
	v := &VM{ID: "vm-1", Name: "one", State: "running", NetIndex: 1, Node: a.ID, CreatedAt: time.Now()}
	if err := s.CreateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	var node string
	if err := s.queryRow(ctx, `SELECT node_id FROM vms WHERE id = ?`, v.ID).Scan(&node); err != nil || node != a.ID {
		t.Fatalf("node_id column: %q %v", node, err)
	}
	if err := s.RemoveNode(ctx, "a"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "VMs are recorded") {
		t.Fatalf("removing a node with VMs: %v", err)
	}
	// The VMs of the database's single-node owner join that owner's node.
	old := &VM{ID: "vm-2", Name: "two", State: "stopped", NetIndex: 2, CreatedAt: time.Now()}
	if err := s.CreateVM(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimOwner(ctx, "owner-x"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.AdoptVMs(ctx, "someone-else", a.ID); err != nil || n != 0 {
		t.Fatalf("adopt by another data dir: %d %v", n, err)
	}
	if n, err := s.AdoptVMs(ctx, "owner-x", a.ID); err != nil || n != 1 {
		t.Fatalf("adopt by the owner: %d %v", n, err)
	}
	if got, _ := s.GetVM(ctx, "two"); got.Node != a.ID {
		t.Fatalf("adopted VM's node: %q", got.Node)
	}
}

// SQLite holds no cluster: node calls say what is needed.
func TestNodesNeedPostgres(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.JoinNode(context.Background(), &Node{ID: "x", Name: "x"}, time.Minute); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("join on SQLite: %v", err)
	}
	if _, err := s.ListNodes(context.Background()); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("list on SQLite: %v", err)
	}
}

// Creates racing for the last room of a node: the node's memory is
// reserved in one transaction per create, so exactly as many VMs as fit
// are recorded, whatever the interleaving; VMs that hold no memory
// (stopped, suspended) take none; Rooms lists live nodes, roomiest first.
func TestPlacementReservesMemory(t *testing.T) {
	s, err := Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, n := range []*Node{{ID: "full-id", Name: "full", MemoryMiB: 2048}, {ID: "roomy-id", Name: "roomy", MemoryMiB: 4096}} {
		if _, err := s.JoinNode(ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// A stopped VM of 1 GiB on the node takes none of its memory.
	if err := s.CreateVM(ctx, &VM{ID: "vm-stopped", Name: "stopped", State: StateStopped, MemoryMiB: 1024, NetIndex: 100, Node: "full-id", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const racers = 10
	errs := make(chan error, racers)
	for i := range racers {
		go func() {
			errs <- s.CreateVM(ctx, &VM{ID: fmt.Sprintf("vm-race-%d", i), Name: fmt.Sprintf("race-%d", i), State: StateCreating,
				MemoryMiB: 512, NetIndex: 1 + i, Node: "full-id", CreatedAt: time.Now()})
		}()
	}
	ok, full := 0, 0
	for range racers {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, ErrNodeFull):
			full++
		default:
			t.Fatalf("a racing create: %v", err)
		}
	}
	if ok != 4 || full != racers-4 {
		t.Fatalf("%d creates of 512 MiB fit on a 2048 MiB node, %d were refused: want 4 and %d", ok, full, racers-4)
	}
	rooms, err := s.Rooms(ctx, 512, Avoid{})
	if err != nil || len(rooms) != 1 || rooms[0].Node != "roomy-id" || rooms[0].FreeMiB != 4096 {
		t.Fatalf("rooms for 512 MiB: %+v %v", rooms, err)
	}
	if rooms, _ := s.Rooms(ctx, 0, Avoid{}); len(rooms) != 2 || rooms[0].Node != "roomy-id" || rooms[1].FreeMiB != 0 {
		t.Fatalf("rooms, roomiest first: %+v", rooms)
	}
	// A VM that stops gives its memory back.
	v, err := s.GetVM(ctx, "race-0")
	if errors.Is(err, ErrNotFound) {
		v, err = s.GetVM(ctx, firstRecorded(t, s, "full-id"))
	}
	if err != nil {
		t.Fatal(err)
	}
	v.State = StateStopped
	if err := s.UpdateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	if rooms, _ := s.Rooms(ctx, 512, Avoid{}); len(rooms) != 2 {
		t.Fatalf("rooms after a VM stopped: %+v", rooms)
	}
	// A live node's VM is not forgotten; once its lease ran out it is.
	if err := s.ForgetVM(ctx, "vm-stopped", "full-id"); !errors.Is(err, ErrConflict) {
		t.Fatalf("forget a live node's VM: %v", err)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm-roomy", Name: "on-roomy", State: StateRunning, MemoryMiB: 512, NetIndex: 200, Node: "roomy-id", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// A suspended VM's stored state: recorded only while it is that
	// node's suspended VM; adopted by another node only once its node is
	// lost, only with that state, and only once.
	if err := s.CreateVM(ctx, &VM{ID: "vm-susp", Name: "susp", State: StateSuspended, MemoryMiB: 512, NetIndex: 201, Node: "roomy-id", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetVMStored(ctx, "vm-roomy", "roomy-id", "m0", time.Now()); !errors.Is(err, ErrConflict) {
		t.Fatalf("store a running VM's state: %v", err)
	}
	if err := s.SetVMStored(ctx, "vm-susp", "full-id", "m1", time.Now()); !errors.Is(err, ErrConflict) {
		t.Fatalf("store another node's VM's state: %v", err)
	}
	if err := s.SetVMStored(ctx, "vm-susp", "roomy-id", "m1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.AdoptVM(ctx, "vm-susp", "roomy-id", "full-id", "m1"); !errors.Is(err, ErrConflict) {
		t.Fatalf("adopt a live node's VM: %v", err)
	}
	// Its own node may hand it over (a drain), with its stored state only.
	if err := s.MoveVM(ctx, "vm-susp", "roomy-id", "full-id", "m0"); !errors.Is(err, ErrConflict) {
		t.Fatalf("move with another stored state: %v", err)
	}
	if err := s.MoveVM(ctx, "vm-roomy", "roomy-id", "full-id", ""); !errors.Is(err, ErrConflict) {
		t.Fatalf("move a running VM: %v", err)
	}
	// A running VM with a stored snapshot: revived by another node only
	// once its node is lost, only as it was, and only once; given back
	// if the restore fails.
	if err := s.CreateVM(ctx, &VM{ID: "vm-run", Name: "run", State: StateRunning, MemoryMiB: 512, NetIndex: 202, Node: "roomy-id", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for i, at := range []int64{10, 30, 20} {
		sn := &Snapshot{ID: fmt.Sprintf("sn-run-%d", i), Name: fmt.Sprintf("run-%d", i), VMID: "vm-run", CreatedAt: time.Unix(at, 0), Node: "roomy-id"}
		if err := s.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if i < 2 { // run-2, the newest of all, is not stored
			if err := s.SetSnapshotStored(ctx, sn.ID, time.Now(), "m"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if sn, err := s.LastStoredSnapshot(ctx, "vm-run"); err != nil || sn.ID != "sn-run-1" {
		t.Fatalf("the newest stored snapshot: %+v %v", sn, err)
	}
	if _, err := s.LastStoredSnapshot(ctx, "vm-roomy"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the newest stored snapshot of a VM without one: %v", err)
	}
	if err := s.ReviveVM(ctx, "vm-run", "roomy-id", "full-id", "running"); !errors.Is(err, ErrConflict) {
		t.Fatalf("revive a live node's VM: %v", err)
	}
	// A node whose lease ran out is no room.
	if err := s.LeaveNode(ctx, "roomy-id", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.ReviveVM(ctx, "vm-run", "roomy-id", "full-id", "paused"); !errors.Is(err, ErrConflict) {
		t.Fatalf("revive a VM that changed meanwhile: %v", err)
	}
	revived := make(chan error, 2)
	for _, to := range []string{"full-id", "third-id"} {
		go func() { revived <- s.ReviveVM(ctx, "vm-run", "roomy-id", to, "running") }()
	}
	if e1, e2 := <-revived, <-revived; (e1 == nil) == (e2 == nil) {
		t.Fatalf("two revives at once: %v and %v, want one to win", e1, e2)
	}
	v, err = s.GetVM(ctx, "vm-run")
	if err != nil || (v.Node != "full-id" && v.Node != "third-id") || v.State != StateCrashed {
		t.Fatalf("the revived VM: %+v %v", v, err)
	}
	before := *v
	before.Node, before.State, before.Disk = "roomy-id", StateRunning, "/lost/disk.qcow2"
	if err := s.GiveBackVM(ctx, &before, "roomy-id"); !errors.Is(err, ErrConflict) {
		t.Fatalf("give back a VM from a node that does not have it: %v", err)
	}
	if err := s.GiveBackVM(ctx, &before, v.Node); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetVM(ctx, "vm-run"); err != nil || v.Node != "roomy-id" || v.State != StateRunning || v.Disk != "/lost/disk.qcow2" {
		t.Fatalf("the VM given back: %+v %v", v, err)
	}
	if err := s.DeleteVM(ctx, "vm-run"); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetVM(ctx, "vm-roomy", "roomy-id"); err != nil {
		t.Fatalf("forget a lost node's VM: %v", err)
	}
	if err := s.AdoptVM(ctx, "vm-susp", "roomy-id", "full-id", "m0"); !errors.Is(err, ErrConflict) {
		t.Fatalf("adopt with a stale stored state: %v", err)
	}
	// Two nodes race to take it over: one wins.
	adopted := make(chan error, 2)
	for _, to := range []string{"full-id", "third-id"} {
		go func() { adopted <- s.AdoptVM(ctx, "vm-susp", "roomy-id", to, "m1") }()
	}
	if e1, e2 := <-adopted, <-adopted; (e1 == nil) == (e2 == nil) {
		t.Fatalf("two adoptions at once: %v and %v, want one to win", e1, e2)
	}
	v, err = s.GetVM(ctx, "vm-susp")
	if err != nil || (v.Node != "full-id" && v.Node != "third-id") || v.StoredManifest != "m1" {
		t.Fatalf("the adopted VM: %+v %v", v, err)
	}
	winner := v.Node
	// Its old node, back too late, cannot drop the stored state (and so
	// cannot wake it): the VM is another node's.
	if err := s.ClearVMStored(ctx, "vm-susp", "roomy-id", "m1"); !errors.Is(err, ErrConflict) {
		t.Fatalf("the old node drops the taken-over VM's stored state: %v", err)
	}
	if err := s.ClearVMStored(ctx, "vm-susp", winner, "m1"); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.GetVM(ctx, "vm-susp"); v == nil || v.StoredManifest != "" || !v.StoredAt.IsZero() {
		t.Fatalf("after ClearVMStored: %+v", v)
	}
	if err := s.DeleteVM(ctx, "vm-susp"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVM(ctx, "vm-roomy"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the forgotten VM: %v", err)
	}
	if rooms, _ := s.Rooms(ctx, 512, Avoid{}); len(rooms) != 1 || rooms[0].Node != "full-id" {
		t.Fatalf("rooms after roomy left: %+v", rooms)
	}
	// A draining node is no room, until it joins again.
	if err := s.SetDraining(ctx, "full-id"); err != nil {
		t.Fatal(err)
	}
	if rooms, _ := s.Rooms(ctx, 0, Avoid{}); len(rooms) != 0 {
		t.Fatalf("rooms with the only live node draining: %+v", rooms)
	}
	if n, err := s.GetNode(ctx, "full-id"); err != nil || !n.Draining {
		t.Fatalf("the draining node: %+v %v", n, err)
	}
	if err := s.SetDraining(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("drain an unknown node: %v", err)
	}
}

// firstRecorded is the name of a VM in state creating on node.
func firstRecorded(t *testing.T, s *Store, node string) string {
	t.Helper()
	vms, err := s.ListVMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if v.Node == node && v.State == StateCreating {
			return v.Name
		}
	}
	t.Fatal("no creating VM on " + node)
	return ""
}

// Notifications reach a listener on another store; a listener catches up
// (onListen) before it hears anything, and again (idle) when nothing came
// for a while; a listening connection that dies ends Listen with an error,
// and one that ends is not given back to the pool.
func TestNotifyListen(t *testing.T) {
	dsn := pgtest.Database(t)
	s, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	defer func(d time.Duration) { listenIdle = d }(listenIdle)
	listenIdle = 300 * time.Millisecond
	listen := func(ctx context.Context) (listening, idle chan struct{}, heard chan string, done chan error) {
		listening, idle, heard, done = make(chan struct{}, 1), make(chan struct{}, 100), make(chan string, 4), make(chan error, 1)
		go func() {
			done <- other.Listen(ctx, func() { listening <- struct{}{} }, func() { idle <- struct{}{} }, func(m string) { heard <- m })
		}()
		select {
		case <-listening:
		case err := <-done:
			t.Fatalf("listen: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("not listening after a minute")
		}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, idle, heard, done := listen(ctx)
	for _, m := range []string{"token:tok_1", "vm:vm-2"} {
		if err := s.Notify(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"token:tok_1", "vm:vm-2"} {
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("heard %q, want %q", got, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%q not heard", want)
		}
	}
	select {
	case <-idle:
	case <-time.After(time.Minute):
		t.Fatal("no idle call after a quiet while")
	}
	if err := s.Notify(ctx, "bad\x00"); !errors.Is(err, ErrBadText) {
		t.Fatalf("a NUL in a notification: %v", err)
	}
	listeners := func() int {
		var n int
		if err := s.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE query IN ('LISTEN agentvm', '-- ping') AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The server ends the listening connection: Listen says so.
	if _, err := s.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query IN ('LISTEN agentvm', '-- ping') AND datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || ctx.Err() != nil {
			t.Fatalf("Listen after its connection died: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Listen did not notice its connection died")
	}
	// A Listen that ends leaves no listening connection behind.
	_, _, _, done = listen(ctx)
	if n := listeners(); n != 1 {
		t.Fatalf("%d listening connections, want 1", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("listen after its context ended: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); listeners() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d listening connections after Listen ended", listeners())
		}
	}
}

// Anti-affinity: a node where a VM already has the avoided label value
// comes after every node where none has, whatever their free memory.
func TestRoomsAvoidLabel(t *testing.T) {
	s, err := Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, n := range []*Node{{ID: "big-id", Name: "big", MemoryMiB: 8192}, {ID: "small-id", Name: "small", MemoryMiB: 2048}} {
		if _, err := s.JoinNode(ctx, n, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	vms := []*VM{
		{ID: "vm-a", Name: "a", State: StateRunning, MemoryMiB: 512, NetIndex: 1, Node: "big-id", Labels: map[string]string{"team": "red"}, CreatedAt: time.Now()},
		{ID: "vm-b", Name: "b", State: StateRunning, MemoryMiB: 512, NetIndex: 2, Node: "small-id", CreatedAt: time.Now()},
		{ID: "vm-c", Name: "c", State: StateStopped, MemoryMiB: 512, NetIndex: 3, Node: "small-id", Labels: map[string]string{"team": "blue"}, CreatedAt: time.Now()},
	}
	for _, v := range vms {
		if err := s.CreateVM(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	order := func(avoid Avoid) string {
		rooms, err := s.Rooms(ctx, 512, avoid)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rooms {
			ids = append(ids, r.Node)
		}
		return strings.Join(ids, ",")
	}
	if got := order(Avoid{}); got != "big-id,small-id" {
		t.Fatalf("no anti-affinity: %s", got)
	}
	if got := order(Avoid{"team", "red"}); got != "small-id,big-id" {
		t.Fatalf("avoiding team=red: %s", got)
	}
	// A stopped VM holds nothing there, and other values do not count.
	if got := order(Avoid{"team", "blue"}); got != "big-id,small-id" {
		t.Fatalf("avoiding team=blue (only a stopped VM has it): %s", got)
	}
	if got := order(Avoid{"team", "green"}); got != "big-id,small-id" {
		t.Fatalf("avoiding team=green: %s", got)
	}
}
