package vm

import (
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// StateBytes is the disk space a suspended VM's saved state takes: the
// allocated blocks of every file of it (the state file and, in the page
// format, its sparse RAM file, whose holes take none). 0 for a VM that is
// not suspended: a running VM's state file is gone once its wake is done.
func (s *Service) StateBytes(v *store.VM) int64 {
	if v.State != store.StateSuspended {
		return 0
	}
	return qemu.DiskUsage(s.suspendPath(v.ID))
}
