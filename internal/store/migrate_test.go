package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A database from before numbered migrations (the tables, version 0) is
// migrated in place: the VM keeps its record and gets its state column.
func TestMigrateFromUnversioned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentvm.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(migrations[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO vms (id, name, net_index, created_at, data) VALUES ('vm1', 'web', 1, 1, '{"id":"vm1","name":"web","state":"suspended"}')`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var version int
	var state string
	s.db.QueryRow(`PRAGMA user_version`).Scan(&version)
	s.db.QueryRow(`SELECT state FROM vms WHERE id='vm1'`).Scan(&state)
	if version != len(migrations) || state != "suspended" {
		t.Fatalf("after migration: version %d, state column %q", version, state)
	}
	v, err := s.GetVM(ctx, "web")
	if err != nil || v.State != "suspended" {
		t.Fatalf("record after migration: %+v %v", v, err)
	}
	v.State = "running"
	if err := s.UpdateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm2", Name: "api", State: "creating", NetIndex: 2, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	rows, _ := s.db.Query(`SELECT id, state FROM vms ORDER BY id`)
	var got []string
	for rows.Next() {
		var id, st string
		rows.Scan(&id, &st)
		got = append(got, id+"="+st)
	}
	rows.Close()
	if strings.Join(got, ",") != "vm1=running,vm2=creating" {
		t.Fatalf("state column not kept with the record: %v", got)
	}
	s.Close()

	// Opening again applies nothing and keeps everything.
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	if vms, _ := s.ListVMs(ctx); len(vms) != 2 {
		t.Fatalf("%d VMs after reopening", len(vms))
	}
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	// A database from a newer agentvm is refused, not written to.
	s.db.Exec(`PRAGMA user_version = 99`)
	s.Close()
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "newer agentvm") {
		t.Fatalf("a newer database was opened: %v", err)
	}
}
