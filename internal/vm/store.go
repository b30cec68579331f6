package vm

import (
	"context"
	"time"

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
	// GetVMFresh reads the database, not the read cache: for what decides
	// or changes a VM (store.GetVMFresh).
	GetVMFresh(ctx context.Context, idOrName string) (*store.VM, error)
	GetVMByIdempotencyKey(ctx context.Context, key string) (*store.VM, error)
	ListVMs(ctx context.Context) ([]*store.VM, error)
	FreeNetIndex(ctx context.Context) (int, error)
	// ForgetVM deletes the record of a VM of a node whose lease ran out.
	ForgetVM(ctx context.Context, id, node string) error
	// SetVMStored and AdoptVM record a suspended VM's state in the object
	// store, and move such a VM of a lost node to this one.
	SetVMStored(ctx context.Context, id, node, manifest string, at time.Time) error
	AdoptVM(ctx context.Context, id, from, to, manifest string) error
	MoveVM(ctx context.Context, id, from, to, manifest string) error
	// ReviveVM moves a lost node's VM here, to be restored from a snapshot.
	ReviveVM(ctx context.Context, id, from, to, state string) error
	GiveBackVM(ctx context.Context, before *store.VM, from string) error
	LastStoredSnapshot(ctx context.Context, vmID string) (*store.Snapshot, error)
	ClearVMStored(ctx context.Context, id, node, manifest string) error

	CreateSnapshot(ctx context.Context, sn *store.Snapshot) error
	GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
	SetSnapshotStored(ctx context.Context, id string, at time.Time, manifest string) error

	CreateNetwork(ctx context.Context, n *store.Network) error
	UpdateNetwork(ctx context.Context, n *store.Network) error
	GetNetwork(ctx context.Context, name string) (*store.Network, error)
	DeleteNetwork(ctx context.Context, name string) error

	DeletePorts(ctx context.Context, vmID string) error

	AddEvent(ctx context.Context, e *store.Event) error
	ListEvents(ctx context.Context, vmID string, after int64, limit int) ([]*store.Event, error)
}

var _ Store = (*store.Store)(nil)

// durable is the service's view of its store: writes do not depend on the
// caller staying. A record follows an effect that already happened (a QEMU
// quit, a disk frozen, a vCPU added): with the request's context a client
// hanging up at the wrong moment lost it, and left a VM listed running
// without a QEMU, or a layer no record names. Reads still end with ctx.
type durable struct{ Store }

func keep(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

func (d durable) CreateVM(ctx context.Context, v *store.VM) error {
	return d.Store.CreateVM(keep(ctx), v)
}
func (d durable) UpdateVM(ctx context.Context, v *store.VM) error {
	return d.Store.UpdateVM(keep(ctx), v)
}
func (d durable) SetVMStored(ctx context.Context, id, node, manifest string, at time.Time) error {
	return d.Store.SetVMStored(keep(ctx), id, node, manifest, at)
}
func (d durable) AdoptVM(ctx context.Context, id, from, to, manifest string) error {
	return d.Store.AdoptVM(keep(ctx), id, from, to, manifest)
}
func (d durable) ReviveVM(ctx context.Context, id, from, to, state string) error {
	return d.Store.ReviveVM(keep(ctx), id, from, to, state)
}
func (d durable) GiveBackVM(ctx context.Context, before *store.VM, from string) error {
	return d.Store.GiveBackVM(keep(ctx), before, from)
}
func (d durable) MoveVM(ctx context.Context, id, from, to, manifest string) error {
	return d.Store.MoveVM(keep(ctx), id, from, to, manifest)
}
func (d durable) ClearVMStored(ctx context.Context, id, node, manifest string) error {
	return d.Store.ClearVMStored(keep(ctx), id, node, manifest)
}
func (d durable) DeleteVM(ctx context.Context, id string) error {
	return d.Store.DeleteVM(keep(ctx), id)
}
func (d durable) ForgetVM(ctx context.Context, id, node string) error {
	return d.Store.ForgetVM(keep(ctx), id, node)
}
func (d durable) CreateSnapshot(ctx context.Context, sn *store.Snapshot) error {
	return d.Store.CreateSnapshot(keep(ctx), sn)
}
func (d durable) SetSnapshotStored(ctx context.Context, id string, at time.Time, manifest string) error {
	return d.Store.SetSnapshotStored(keep(ctx), id, at, manifest)
}
func (d durable) DeleteSnapshot(ctx context.Context, id string) error {
	return d.Store.DeleteSnapshot(keep(ctx), id)
}
func (d durable) CreateNetwork(ctx context.Context, n *store.Network) error {
	return d.Store.CreateNetwork(keep(ctx), n)
}
func (d durable) UpdateNetwork(ctx context.Context, n *store.Network) error {
	return d.Store.UpdateNetwork(keep(ctx), n)
}
func (d durable) DeleteNetwork(ctx context.Context, name string) error {
	return d.Store.DeleteNetwork(keep(ctx), name)
}
func (d durable) DeletePorts(ctx context.Context, vmID string) error {
	return d.Store.DeletePorts(keep(ctx), vmID)
}
func (d durable) AddEvent(ctx context.Context, e *store.Event) error {
	return d.Store.AddEvent(keep(ctx), e)
}
