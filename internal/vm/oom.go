package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"github.com/agentvm/agentvm/internal/store"
)

// The order in which the host's OOM killer picks a process when memory runs
// out (docs/operations.md): warm-pool VMs first (nobody has them yet), then
// users' VMs, among which the kernel picks the one with the most memory
// resident, and the daemon never: -900 where it may lower its score
// (CAP_SYS_RESOURCE), else the default 0, below every VM either way.
const (
	OOMScoreDaemon = -900
	oomScoreVM     = 500
	oomScorePool   = 800
)

// oomScore is the OOM score adjustment of the QEMU of a VM in state st.
func oomScore(st store.State) int {
	if st == statePool {
		return oomScorePool
	}
	return oomScoreVM
}

// SetOOMScore sets process pid's oom_score_adj. Raising it needs no
// privilege, nor lowering it down to 0 (a pool VM claimed); below 0 (the
// daemon's own) needs CAP_SYS_RESOURCE.
func SetOOMScore(pid, score int) error {
	err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(score)), 0)
	if err != nil {
		return fmt.Errorf("oom_score_adj of pid %d: %w", pid, err)
	}
	return nil
}

// setMachineOOMScore gives a VM's QEMU the score of its state. A machine
// without a process of its own (the fake hypervisor's) is left alone.
func (s *Service) setMachineOOMScore(pid int, st store.State) {
	if err := SetOOMScore(pid, oomScore(st)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("OOM order not set", "pid", pid, "err", err)
	}
}
