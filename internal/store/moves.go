package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// The moves of a suspended VM's stored state between nodes (a node's
// object store, vm/vmstore.go): each one statement, conditional on what
// the caller read, so that of nodes acting at once one wins and the
// others get ErrConflict.

// SetVMStored records that suspended VM id of node has its state in the
// object store under manifest; ErrConflict if the VM is no longer that
// node's suspended VM (it woke, or moved, meanwhile).
func (s *Store) SetVMStored(ctx context.Context, id, node, manifest string, at time.Time) error {
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer suspended on node %s", ErrConflict, id, node),
		`UPDATE vms SET stored_at = ?, stored_manifest = ? WHERE id = ? AND node_id = ? AND state = 'suspended'`,
		nanos(at), manifest, id, node)
}

// ClearVMStored makes VM id's stored state manifest no longer its, in one
// statement only while the VM is still node's with that state
// (ErrConflict otherwise: another node took it over meanwhile).
func (s *Store) ClearVMStored(ctx context.Context, id, node, manifest string) error {
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer node %s's with that stored state (another node took it over)", ErrConflict, id, node),
		`UPDATE vms SET stored_at = 0, stored_manifest = '' WHERE id = ? AND node_id = ? AND stored_manifest = ?`, id, node, manifest)
}

// AdoptVM moves suspended VM id from node from, whose lease has run out, to
// node to, in one statement only while its stored state is still manifest
// and from is still lost: of nodes that try at once, one wins, and a node
// that came back keeps its VM (ErrConflict).
func (s *Store) AdoptVM(ctx context.Context, id, from, to, manifest string) error {
	if !s.pg {
		return fmt.Errorf("%w: VMs move between nodes only in a cluster", ErrConflict)
	}
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer a lost node's suspended VM with that stored state (its node is back, another node took it, or it changed)", ErrConflict, id),
		`UPDATE vms SET node_id = ? WHERE id = ? AND node_id = ? AND state = 'suspended'
AND stored_manifest = ? AND stored_manifest <> ''
AND `+nodeLost, to, id, from, manifest, from)
}

// MoveVM hands suspended VM id of node from to node to, in one statement
// only while it is still from's suspended VM with stored state manifest
// (ErrConflict otherwise): the drain of a live node.
func (s *Store) MoveVM(ctx context.Context, id, from, to, manifest string) error {
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer node %s's suspended VM with that stored state", ErrConflict, id, from),
		`UPDATE vms SET node_id = ? WHERE id = ? AND node_id = ? AND state = 'suspended'
AND stored_manifest = ? AND stored_manifest <> ''`, to, id, from, manifest)
}

// updateOne runs q and returns none if it changed no row.
func (s *Store) updateOne(ctx context.Context, none error, q string, args ...any) error {
	r, err := s.exec(ctx, q, args...)
	if err != nil {
		return err
	}
	n, err := r.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return none
	}
	return nil
}

// ReviveVM moves VM id, state state on node from whose lease has run out,
// to node to and records it crashed there, in one statement only while
// from is still lost and the VM unchanged: node to then restores it from
// its newest stored snapshot (vm.revive). Of nodes that try at once, one
// wins (ErrConflict for the others), and a node that came back keeps its
// VM. A node that dies mid-restore leaves it crashed on a lost node, for
// another to revive.
func (s *Store) ReviveVM(ctx context.Context, id, from, to, state string) error {
	if !s.pg {
		return fmt.Errorf("%w: VMs move between nodes only in a cluster", ErrConflict)
	}
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer a lost node's %s VM (its node is back, another node took it, or it changed)", ErrConflict, id, state),
		`UPDATE vms SET node_id = ?, state = 'crashed', pid = 0 WHERE id = ? AND node_id = ? AND state = ? AND stored_manifest = ''
AND `+nodeLost, to, id, from, state, from)
}

// GiveBackVM undoes a ReviveVM whose restore failed: the VM, crashed on
// node from, gets back its whole record as it was before (before, naming
// its lost node, its disk and its state), so that its node finds its files
// if it comes back and the VM can be revived again.
func (s *Store) GiveBackVM(ctx context.Context, before *VM, from string) error {
	args := append(updateArgs(vmArgs(before)), from)
	return s.updateOne(ctx, fmt.Errorf("%w: VM %s is no longer node %s's crashed VM", ErrConflict, before.ID, from),
		vmQ.update+` AND node_id = ? AND state = 'crashed'`, args...)
}

// LastStoredSnapshot is VM id's newest snapshot in the object store
// (ErrNotFound: none).
func (s *Store) LastStoredSnapshot(ctx context.Context, vmID string) (*Snapshot, error) {
	sn, err := scanSnapshot(s.queryRow(ctx, snapshotQ.list+` WHERE vm_id = ? AND stored_at > 0 ORDER BY created_at DESC LIMIT 1`, vmID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return sn, err
}
