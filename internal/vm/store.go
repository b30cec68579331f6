package vm

import (
	"context"

	"github.com/agentvm/agentvm/internal/store"
)

// Store is what the VM service needs from its metadata store: the records of
// VMs, snapshots, private networks and events, and the port exposures it
// removes with a VM. *store.Store (SQLite) implements it; a multi-node
// store or a unit test's fake can too.
type Store interface {
	CreateVM(ctx context.Context, v *store.VM) error
	UpdateVM(ctx context.Context, v *store.VM) error
	DeleteVM(ctx context.Context, id string) error
	GetVM(ctx context.Context, idOrName string) (*store.VM, error)
	GetVMByIdempotencyKey(ctx context.Context, key string) (*store.VM, error)
	ListVMs(ctx context.Context) ([]*store.VM, error)
	FreeNetIndex(ctx context.Context) (int, error)

	CreateSnapshot(ctx context.Context, sn *store.Snapshot) error
	GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error

	CreateNetwork(ctx context.Context, n *store.Network) error
	UpdateNetwork(ctx context.Context, n *store.Network) error
	GetNetwork(ctx context.Context, name string) (*store.Network, error)
	DeleteNetwork(ctx context.Context, name string) error

	DeletePorts(ctx context.Context, vmID string) error

	AddEvent(ctx context.Context, e *store.Event) error
	ListEvents(ctx context.Context, vmID string, after int64, limit int) ([]*store.Event, error)
}

var _ Store = (*store.Store)(nil)
