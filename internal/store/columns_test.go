package store

import (
	"context"
	"database/sql"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// Records whose every field is set, each to a value no other field has, so
// that a field without a column, or two columns read in each other's
// place, changes what reads back.
func fullRecords() (*VM, *Snapshot, *Network, *Token, *Event, *Node) {
	at := time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC)
	started := at.Add(time.Second)
	saved := &SavedBy{QEMU: "10.0.2", Machine: "pc-q35-10.0", Accel: "tcg", CPUModel: "max", DeviceSet: "v2", HostBoot: "boot-1"}
	v := &VM{ID: "vm1", Name: "web", State: StateSuspended, CPUs: 2, MemoryMiB: 1024, DiskBytes: 4 << 30,
		Labels: map[string]string{"team": "a"}, Env: map[string]string{"K": "v"}, NetIndex: 7, PID: 4242,
		Template: "tpl-1", MachineID: "mid", Error: "last error", IdempotencyKey: "key-1", CreatedAt: at, StartedAt: &started,
		CreateMs: 812, Image: "browser", ColdBoot: true, Disk: "layers/top.qcow2", Layers: []string{"l1", "l2"}, Source: "snap-1",
		Layout: "cpu-hotplug", HotMemoryMiB: 512, SavedBy: saved, NextCPUs: 4, NextMemoryMiB: 2048, ResumeOnStart: true,
		IdleTimeoutSec: 600, DeleteAfterSec: 86400, Restart: "on-failure", Network: "net-a",
		Egress: &Egress{Mode: "allow", Allow: []string{"deb.debian.org"}, AllowHost: []int{8080}}, Node: "node-1",
		StoredAt: at.Add(2 * time.Minute), StoredManifest: "def"}
	sn := &Snapshot{ID: "snap-1", Name: "base", VMID: "vm1", VMName: "web", CPUs: 3, MemoryMiB: 1536, DiskBytes: 5 << 30,
		Env: map[string]string{"S": "t"}, Disk: "layers/frozen.qcow2", Layers: []string{"l1"}, State: "states/snap-1",
		Bytes: 123456, PausedMs: 42, Key: "shape", Image: "code-interpreter", CreatedAt: at, Network: "net-b",
		Egress: &Egress{Mode: "deny"}, NetworkEgress: &Egress{Mode: "public"}, HotMemoryMiB: 256, SavedBy: saved, Node: "node-2",
		StoredAt: at.Add(time.Minute), StoredManifest: "abc"}
	n := &Network{Name: "net-a", Egress: &Egress{Mode: "allow", Allow: []string{"10.0.0.0/8"}}, CreatedAt: at}
	tk := &Token{ID: "tok-1", Hash: "hash-1", VMID: "vm1", Allow: []string{"exec", "files"}, User: "dev", Name: "ci",
		CreatedAt: at, ExpiresAt: at.Add(100 * 365 * 24 * time.Hour), SSHKeys: []string{"ssh-ed25519 AAAA test"},
		Repo: "app", Branches: "agent/*"} // a real token has a VM or a repository, not both
	ev := &Event{Seq: 1, VMID: "vm1", Time: at, Type: "lifecycle", Actor: "admin", Message: "created", Data: map[string]string{"ms": "812"}}
	nd := &Node{ID: "node-1", Name: "a", Address: "10.0.0.1:7070", PeerAddress: "10.0.0.1:7071", CPUs: 16, MemoryMiB: 65536, QEMUVersion: "10.0.2",
		MachineType: "pc-q35-10.0", CPUModel: "host", Accel: "kvm"}
	return v, sn, n, tk, ev, nd
}

// allSet fails for a zero field of a record: a field added to the type
// must be added to fullRecords, and so to what this file checks.
func allSet(t *testing.T, rec any, skip ...string) {
	t.Helper()
	rv := reflect.ValueOf(rec).Elem()
	for i := 0; i < rv.NumField(); i++ {
		name := rv.Type().Field(i).Name
		if rv.Field(i).IsZero() && !slices.Contains(skip, name) {
			t.Fatalf("%T.%s is not set in fullRecords", rec, name)
		}
	}
}

func checkRecords(t *testing.T, ctx context.Context, s *Store, legacy bool) {
	t.Helper()
	v, sn, n, tk, ev, _ := fullRecords()
	if legacy {
		sn.Node, sn.StoredAt, sn.StoredManifest = "", time.Time{}, "" // none existed at schema 5
		v.StoredAt, v.StoredManifest = time.Time{}, ""
		tk.Repo, tk.Branches = "", "" // none existed at schema 5
	}
	if got, err := s.GetVM(ctx, v.ID); err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("VM read back:\n got %+v (%v)\nwant %+v", got, err, v)
	}
	if got, err := s.GetVMByIdempotencyKey(ctx, v.IdempotencyKey); err != nil || got.ID != v.ID {
		t.Fatalf("VM by idempotency key: %+v %v", got, err)
	}
	if got, err := s.GetSnapshot(ctx, sn.Name); err != nil || !reflect.DeepEqual(got, sn) {
		t.Fatalf("snapshot read back:\n got %+v (%v)\nwant %+v", got, err, sn)
	}
	if got, err := s.GetNetwork(ctx, n.Name); err != nil || !reflect.DeepEqual(got, n) {
		t.Fatalf("network read back: %+v (%v)", got, err)
	}
	if got, err := s.TokenByHash(ctx, tk.Hash, tk.CreatedAt); err != nil || !reflect.DeepEqual(got, tk) {
		t.Fatalf("token read back:\n got %+v (%v)\nwant %+v", got, err, tk)
	}
	if got, err := s.ListEvents(ctx, ev.VMID, 0, 10); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], ev) {
		t.Fatalf("events read back: %+v (%v)", got, err)
	}
}

// Every field of every record survives a write and a read, on each backend,
// and an update rewrites every column.
func TestRecordColumnsRoundTrip(t *testing.T) {
	v, sn, n, tk, ev, nd := fullRecords()
	for _, r := range []any{v, sn, n, tk, ev} {
		allSet(t, r)
	}
	allSet(t, nd, "Generation", "LeaseExpires", "JoinedAt", "Alive", "LeaseLeft", "Draining") // draining: SetDraining, tested in nodes_test
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		v, sn, n, tk, ev, _ := fullRecords()
		for _, err := range []error{s.CreateVM(ctx, v), s.CreateSnapshot(ctx, sn), s.CreateNetwork(ctx, n), s.CreateToken(ctx, tk), s.AddEvent(ctx, ev)} {
			if err != nil {
				t.Fatal(err)
			}
		}
		checkRecords(t, ctx, s, false)
		// An update to the zero values clears every column but the key.
		empty := &VM{ID: v.ID, Name: "renamed", NetIndex: 9}
		if err := s.UpdateVM(ctx, empty); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetVM(ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, empty) {
			t.Fatalf("VM after an update to zero values: %+v", got)
		}
		if s.pg {
			nd.ID = "node-rt"
			if _, err := s.JoinNode(ctx, nd, time.Minute); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetNode(ctx, nd.ID)
			if err != nil || got.CPUs != nd.CPUs || got.MemoryMiB != nd.MemoryMiB || got.QEMUVersion != nd.QEMUVersion ||
				got.MachineType != nd.MachineType || got.CPUModel != nd.CPUModel || got.Accel != nd.Accel || got.Address != nd.Address || got.PeerAddress != nd.PeerAddress {
				t.Fatalf("node read back: %+v %v", got, err)
			}
		}
	})
}

// The records of fullRecords as a schema-5 database held them, in the JSON
// of the agentvm that wrote them (fixed text: the types' tags may change,
// the records already written do not). Snapshots had no node then, and
// nodes no peer address.
const (
	legacyVM       = `{"id":"vm1","name":"web","state":"suspended","cpus":2,"memory_mib":1024,"disk_bytes":4294967296,"labels":{"team":"a"},"env":{"K":"v"},"net_index":7,"pid":4242,"template":"tpl-1","machine_id":"mid","error":"last error","idempotency_key":"key-1","created_at":"2026-12-02T01:02:03.456789Z","started_at":"2026-12-02T01:02:04.456789Z","create_ms":812,"image":"browser","cold_boot":true,"disk":"layers/top.qcow2","layers":["l1","l2"],"source":"snap-1","layout":"cpu-hotplug","hot_memory_mib":512,"saved_by":{"qemu":"10.0.2","machine":"pc-q35-10.0","accel":"tcg","cpu_model":"max","device_set":"v2","host_boot":"boot-1"},"next_cpus":4,"next_memory_mib":2048,"resume_on_start":true,"idle_timeout_s":600,"delete_after_s":86400,"restart":"on-failure","network":"net-a","egress":{"mode":"allow","allow":["deb.debian.org"],"allow_host":[8080]},"node":"node-1"}`
	legacySnapshot = `{"id":"snap-1","name":"base","vm_id":"vm1","vm_name":"web","cpus":3,"memory_mib":1536,"disk_bytes":5368709120,"env":{"S":"t"},"disk":"layers/frozen.qcow2","layers":["l1"],"state":"states/snap-1","bytes":123456,"paused_ms":42,"key":"shape","image":"code-interpreter","created_at":"2026-12-02T01:02:03.456789Z","network":"net-b","egress":{"mode":"deny"},"network_egress":{"mode":"public"},"hot_memory_mib":256,"saved_by":{"qemu":"10.0.2","machine":"pc-q35-10.0","accel":"tcg","cpu_model":"max","device_set":"v2","host_boot":"boot-1"}}`
	legacyNetwork  = `{"name":"net-a","egress":{"mode":"allow","allow":["10.0.0.0/8"]},"created_at":"2026-12-02T01:02:03.456789Z"}`
	legacyToken    = `{"id":"tok-1","hash":"hash-1","vm_id":"vm1","allow":["exec","files"],"user":"dev","name":"ci","created_at":"2026-12-02T01:02:03.456789Z","expires_at":"2126-11-08T01:02:03.456789Z","ssh_keys":["ssh-ed25519 AAAA test"]}`
	legacyEvent    = `{"seq":1,"vm_id":"vm1","time":"2026-12-02T01:02:03.456789Z","type":"lifecycle","actor":"admin","message":"created","data":{"ms":"812"}}`
	legacyNode     = `{"id":"node-1","name":"a","address":"10.0.0.1:7070","cpus":16,"memory_mib":65536,"qemu_version":"10.0.2","machine_type":"pc-q35-10.0","cpu_model":"host","accel":"kvm"}`
)

// legacyRows writes the records as a schema-5 database held them: JSON in
// each table's data column.
func legacyRows(t *testing.T, db *sql.DB, pg bool) {
	t.Helper()
	v, sn, n, tk, ev, nd := fullRecords()
	q := func(s string) string {
		if pg {
			return rebind(s)
		}
		return s
	}
	stmts := []struct {
		q    string
		args []any
	}{
		{`INSERT INTO vms (id, name, idempotency_key, net_index, state, node_id, created_at, data) VALUES (?,?,?,?,?,?,?,?)`,
			[]any{v.ID, v.Name, v.IdempotencyKey, v.NetIndex, string(v.State), v.Node, v.CreatedAt.UnixNano(), legacyVM}},
		{`INSERT INTO snapshots (id, name, created_at, data) VALUES (?,?,?,?)`, []any{sn.ID, sn.Name, sn.CreatedAt.UnixNano(), legacySnapshot}},
		{`INSERT INTO networks (name, created_at, data) VALUES (?,?,?)`, []any{n.Name, n.CreatedAt.UnixNano(), legacyNetwork}},
		{`INSERT INTO tokens (id, hash, vm_id, expires_at, created_at, data) VALUES (?,?,?,?,?,?)`,
			[]any{tk.ID, tk.Hash, tk.VMID, tk.ExpiresAt.UnixNano(), tk.CreatedAt.UnixNano(), legacyToken}},
		{`INSERT INTO events (vm_id, time, data) VALUES (?,?,?)`, []any{ev.VMID, ev.Time.UnixNano(), legacyEvent}},
	}
	if pg {
		stmts = append(stmts, struct {
			q    string
			args []any
		}{`INSERT INTO nodes (id, name, address, generation, lease_expires, joined_at, data) VALUES (?,?,?,1,now(),now(),?)`,
			[]any{nd.ID, nd.Name, nd.Address, legacyNode}})
	}
	for _, st := range stmts {
		if _, err := db.Exec(q(st.q), st.args...); err != nil {
			t.Fatalf("%s: %v", st.q, err)
		}
	}
}

// A database at schema 5 (records as JSON) opens with every field of every
// record in its columns, and without the JSON.
func TestMigrateRecordsToColumns(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, s *Store) {
		checkRecords(t, ctx, s, true)
		for _, table := range []string{"vms", "snapshots", "networks", "tokens", "events", "nodes"} {
			if _, err := s.db.Exec(`SELECT data FROM ` + table); err == nil {
				t.Fatalf("%s still has its data column", table)
			}
		}
		if s.pg {
			_, _, _, _, _, nd := fullRecords()
			got, err := s.GetNode(ctx, nd.ID)
			if err != nil || got.CPUs != nd.CPUs || got.MemoryMiB != nd.MemoryMiB || got.QEMUVersion != nd.QEMUVersion || got.Accel != nd.Accel {
				t.Fatalf("node after migration: %+v %v", got, err)
			}
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		path := t.TempDir() + "/agentvm.db"
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			if _, err := db.Exec(migrations[i]); err != nil {
				t.Fatal(err)
			}
		}
		db.Exec(`PRAGMA user_version = 5`)
		legacyRows(t, db, false)
		db.Close()
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.Database(t)
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			if _, err := db.Exec(pgMigrations[i]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.Exec(`CREATE TABLE schema_version (one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (TRUE, 5)`); err != nil {
			t.Fatal(err)
		}
		legacyRows(t, db, true)
		// A node of the cluster still runs (its lease is live): the
		// upgrade is refused, and nothing changes.
		if _, err := db.Exec(`UPDATE nodes SET lease_expires = now() + interval '1 hour'`); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(dsn); err == nil || !strings.Contains(err.Error(), "stop every node") {
			t.Fatalf("an upgrade with a node running: %v", err)
		}
		if _, err := db.Exec(`UPDATE nodes SET lease_expires = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		s, err := Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s)
	})
}
