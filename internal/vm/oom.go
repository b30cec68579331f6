package vm

import (
	"errors"
	"io/fs"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// The order in which the host's OOM killer picks a process when memory runs
// out (docs/operations.md): warm-pool VMs first (1000: always, nobody has
// them yet), then users' VMs (500 on top of their share of memory, so the
// biggest first), then everything else, the daemon included (it keeps the
// default 0: lowering it would need CAP_SYS_RESOURCE, and every process it
// starts, image builds included, would inherit the lower score).
const (
	oomScoreVM   = 500
	oomScorePool = 1000
)

// oomScore is the OOM score adjustment of the QEMU of a VM in state st.
func oomScore(st store.State) int {
	if st == statePool {
		return oomScorePool
	}
	return oomScoreVM
}

// setMachineOOMScore gives a running VM's QEMU the score of its state (QEMU
// gets its first one as it starts: qemu.Config.OOMScoreAdj). A machine
// without a process of its own (the fake hypervisor's) is left alone.
func (s *Service) setMachineOOMScore(pid int, st store.State) {
	if err := qemu.SetOOMScoreAdj(pid, oomScore(st)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("OOM order not set", "pid", pid, "err", err)
	}
}
