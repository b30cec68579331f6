package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/s3test"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/pkg/client"
)

// The cluster benchmark (issue 16's "bench -cluster"): nodes of one
// cluster on a PostgreSQL the run starts (Debian's package, as the tests
// do), all on this machine. It measures create p50 on 1, 2 and 3 nodes
// (creates sent to the nodes in turn, each placed on the roomiest node)
// against the single-node daemon of
// the same run on SQLite, and the exec round trip of `true` sent to the
// VM's own node against the same sent to another node, which forwards it
// (peer TLS), interleaved.

// ClusterReport is the result of -cluster.
type ClusterReport struct {
	CreateSingle Stats     `json:"create_single_node_sqlite"`
	Create       []Stats   `json:"create_cluster_by_nodes"` // [0] is 1 node
	CreateRatio  []float64 `json:"create_ratio_to_single"`
	ExecOwn      Stats     `json:"exec_true_own_node"`
	ExecVia      Stats     `json:"exec_true_via_other_node"`
	ExecAddedMs  float64   `json:"exec_added_p50_ms"`
	Nodes        int       `json:"nodes"`
	// PlacementPerSec is creates admitted per second by the database
	// alone: rooms read and the VM's memory reserved (store.Rooms and
	// store.CreateVM), from placementWorkers goroutines onto 3 nodes.
	PlacementPerSec float64 `json:"placement_creates_per_s"`
	Placements      int     `json:"placements"`
	// A 1 GiB VM with 400 MiB of its memory written (tmpfs): suspend and wake on
	// its node, then moved by a drain (suspend, store in the S3 server,
	// fetch and wake on another node), in ms.
	SameNodeSuspendMs float64 `json:"same_node_suspend_ms"`
	SameNodeWakeMs    float64 `json:"same_node_wake_ms"`
	MoveMs            float64 `json:"move_to_other_node_ms"`
	MoveBytes         int64   `json:"move_state_bytes"`
}

const (
	placements       = 600
	placementWorkers = 8
)

// placementThroughput admits placements VMs on 3 recorded nodes of a
// database of their own, through the store as a node does it, and
// returns creates per second.
func placementThroughput(ctx context.Context, dsn string) (float64, error) {
	st, err := store.Open(dsn)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	for i := 1; i <= 3; i++ {
		n := &store.Node{ID: fmt.Sprintf("bench-node-%d", i), Name: fmt.Sprintf("bench-%d", i), MemoryMiB: 1 << 30}
		if _, err := st.JoinNode(ctx, n, time.Hour); err != nil {
			return 0, err
		}
	}
	var next atomic.Int64
	errs := make(chan error, placementWorkers)
	t0 := time.Now()
	for w := 0; w < placementWorkers; w++ {
		go func() {
			for {
				i := next.Add(1)
				if i > placements {
					errs <- nil
					return
				}
				rooms, err := st.Rooms(ctx, 512, store.Avoid{})
				if err != nil || len(rooms) == 0 {
					errs <- fmt.Errorf("rooms: %v (%d)", err, len(rooms))
					return
				}
				v := &store.VM{ID: fmt.Sprintf("vm-place-%d", i), Name: fmt.Sprintf("place-%d", i), State: store.StateCreating,
					MemoryMiB: 512, NetIndex: int(i), Node: rooms[0].Node, CreatedAt: time.Now()}
				if err := st.CreateVM(ctx, v); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for w := 0; w < placementWorkers; w++ {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	return placements / time.Since(t0).Seconds(), nil
}

const clusterCreates = 10

func (b *bench) runCluster(ctx context.Context) error {
	rep := &ClusterReport{}
	b.r.Cluster = rep
	// The single-node baseline: this run's own server.
	single, err := timeCreates(ctx, []*client.Client{b.c}, clusterCreates)
	if err != nil {
		return fmt.Errorf("single-node creates: %w", err)
	}
	rep.CreateSingle = summarize(single)
	logf("single node (SQLite): create p50 %.0f ms", rep.CreateSingle.P50)

	pg, err := pgtest.Start(ctx)
	if err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	defer pg.Stop()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		return err
	}
	s3, err := s3test.Start(ctx, b.tmp)
	if err != nil {
		return fmt.Errorf("S3 server: %w", err)
	}
	defer s3.Stop()
	for k, v := range s3.Env() {
		os.Setenv(k, v)
	}
	bin := filepath.Dir(b.srv.cmd.Path)
	var nodes []*server
	defer func() {
		for _, n := range nodes {
			deleteAll(context.Background(), n.client)
		}
		for _, n := range nodes {
			if err := n.stop(); err != nil {
				logf("stopping a node: %v", err)
			}
			n.removeRunDir()
		}
	}()
	var clients []*client.Client
	for i := 1; i <= 3; i++ {
		dir := filepath.Join(b.tmp, fmt.Sprintf("node-%d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		n, err := startServer(ctx, bin, dir, true, 0, "--store", dsn, "--cluster", "--node-name", fmt.Sprintf("node-%d", i), "--objects", s3.URL("bench"))
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		nodes = append(nodes, n)
		clients = append(clients, n.client)
		d, err := timeCreates(ctx, clients, clusterCreates)
		if err != nil {
			return fmt.Errorf("creates on %d nodes: %w", i, err)
		}
		st := summarize(d)
		rep.Create = append(rep.Create, st)
		rep.CreateRatio = append(rep.CreateRatio, st.P50/rep.CreateSingle.P50)
		logf("%d node(s): create p50 %.0f ms", i, st.P50)
	}
	rep.Nodes = len(nodes)

	// Exec: a VM on node 2, asked through node 2 and through node 1.
	v, err := nodes[1].client.CreateVM(ctx, vmShape)
	if err != nil {
		return err
	}
	execOnce := func(c *client.Client) (float64, error) {
		t0 := time.Now()
		res, err := c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return float64(time.Since(t0).Microseconds()) / 1000, err
	}
	for i := 0; i < 5; i++ { // warm-up, both paths
		if _, err := execOnce(nodes[1].client); err != nil {
			return err
		}
		if _, err := execOnce(nodes[0].client); err != nil {
			return err
		}
	}
	var own, via []float64
	for i := 0; i < b.o.execs; i++ {
		first, second, fd, sd := nodes[1].client, nodes[0].client, &own, &via
		if i%2 == 1 {
			first, second, fd, sd = second, first, sd, fd
		}
		d, err := execOnce(first)
		if err != nil {
			return err
		}
		*fd = append(*fd, d)
		if d, err = execOnce(second); err != nil {
			return err
		}
		*sd = append(*sd, d)
	}
	rep.ExecOwn, rep.ExecVia = summarize(own), summarize(via)
	rep.ExecAddedMs = rep.ExecVia.P50 - rep.ExecOwn.P50
	if err := moveBench(ctx, rep, nodes[0].client); err != nil {
		return fmt.Errorf("suspend on one node, wake on another: %w", err)
	}

	pdsn, err := pg.NewDatabase(ctx)
	if err != nil {
		return err
	}
	if rep.PlacementPerSec, err = placementThroughput(ctx, pdsn); err != nil {
		return fmt.Errorf("placement throughput: %w", err)
	}
	rep.Placements = placements
	return nil
}

// moveBench times a 1 GiB VM's suspend and wake on its node, then its
// move to another node by a drain of its node (the last measurement: the
// drained node takes no more VMs).
func moveBench(ctx context.Context, rep *ClusterReport, c *client.Client) error {
	v, err := c.CreateVM(ctx, api.CreateVMRequest{Memory: 1 << 30, Disk: vmDisk})
	if err != nil {
		return err
	}
	if res, err := c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"sh", "-c", "head -c 400M /dev/urandom > /dev/shm/fill"}}); err != nil || res.ExitCode != 0 {
		return fmt.Errorf("fill memory: %v %+v", err, res)
	}
	t0 := time.Now()
	if _, err := c.SuspendVM(ctx, v.ID); err != nil {
		return err
	}
	rep.SameNodeSuspendMs = float64(time.Since(t0).Microseconds()) / 1000
	t0 = time.Now()
	if _, err := c.WakeVM(ctx, v.ID); err != nil {
		return err
	}
	rep.SameNodeWakeMs = float64(time.Since(t0).Microseconds()) / 1000
	t0 = time.Now()
	res, err := c.DrainNode(ctx, v.Node)
	if err != nil {
		return err
	}
	rep.MoveMs = float64(time.Since(t0).Microseconds()) / 1000
	for _, d := range res.VMs {
		if d.ID == v.ID && (d.Error != "" || d.State != api.StateRunning) {
			return fmt.Errorf("the drain left the VM: %+v", d)
		}
	}
	got, err := c.GetVM(ctx, v.ID)
	if err != nil {
		return err
	}
	if got.Node == v.Node {
		return fmt.Errorf("the VM is still on %s after the drain", v.Node)
	}
	rep.MoveBytes = got.StateBytes
	logf("1 GiB VM: suspend %.0f ms + wake %.0f ms on its node; moved by a drain to %s in %.0f ms",
		rep.SameNodeSuspendMs, rep.SameNodeWakeMs, got.Node, rep.MoveMs)
	return nil
}

// timeCreates makes n VMs, sent to the clients in turn, each deleted
// (untimed) before the next, and returns the creates' wall times in ms.
func timeCreates(ctx context.Context, cs []*client.Client, n int) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		c := cs[i%len(cs)]
		t0 := time.Now()
		v, err := c.CreateVM(ctx, vmShape)
		if err != nil {
			return nil, err
		}
		out = append(out, float64(time.Since(t0).Microseconds())/1000)
		if err := c.DeleteVM(ctx, v.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// deleteAll deletes every VM a node lists (best effort, at the end).
func deleteAll(ctx context.Context, c *client.Client) {
	vms, err := c.ListVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		c.DeleteVM(ctx, v.ID)
	}
}

// PrintCluster prints the -cluster table.
func (r *Report) PrintCluster(w io.Writer) {
	c := r.Cluster
	if c == nil {
		return
	}
	fmt.Fprintf(w, "Cluster on one machine (%d nodes, PostgreSQL from Debian's package), same run\n", c.Nodes)
	statsLine(w, "create, single node (SQLite)", c.CreateSingle)
	for i, st := range c.Create {
		statsLine(w, fmt.Sprintf("create, cluster of %d", i+1), st)
		ratioLine(w, fmt.Sprintf("%d nodes / single node p50 (target <= 1.3)", i+1), c.CreateRatio[i])
	}
	statsLine(w, "exec true, sent to its node", c.ExecOwn)
	statsLine(w, "exec true, sent to another node", c.ExecVia)
	fmt.Fprintf(w, "  added by forwarding, p50             %8.1f ms   (target <= 2 ms)\n", c.ExecAddedMs)
	fmt.Fprintf(w, "  placement by the database alone      %8.0f creates/s   (%d creates, %d clients, 3 nodes)\n", c.PlacementPerSec, c.Placements, placementWorkers)
	fmt.Fprintf(w, "  1 GiB VM (400 MiB written), its node:  suspend %8.0f ms + wake %8.0f ms = %8.0f ms\n", c.SameNodeSuspendMs, c.SameNodeWakeMs, c.SameNodeSuspendMs+c.SameNodeWakeMs)
	fmt.Fprintf(w, "  same VM moved by a drain (suspend, store in S3, fetch, wake on another node): %8.0f ms (%.1fx its node's suspend + wake)\n",
		c.MoveMs, c.MoveMs/(c.SameNodeSuspendMs+c.SameNodeWakeMs))
}
