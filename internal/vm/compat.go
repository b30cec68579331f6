package vm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// ErrStateIncompatible marks a saved state (a snapshot's or a suspended VM's)
// that this daemon's QEMU cannot load; errors.Is also finds ErrConflict in it.
var ErrStateIncompatible = &StateIncompatibleError{}

// StateIncompatibleError says why a saved state cannot be restored here,
// naming what wrote it and what runs now.
type StateIncompatibleError struct {
	What  string // "snapshot s1", "VM box1's suspended state"
	Saved store.SavedBy
	Here  store.SavedBy
	Why   string
}

func (e *StateIncompatibleError) Error() string {
	return fmt.Sprintf("%s: %s", e.What, e.Why)
}

// Is makes every StateIncompatibleError match ErrStateIncompatible and ErrConflict.
func (e *StateIncompatibleError) Is(target error) bool {
	return target == ErrStateIncompatible || target == ErrConflict
}

// savedByHere is what a state written by this daemon now records.
func (s *Service) savedByHere(deviceSet string) *store.SavedBy {
	return &store.SavedBy{QEMU: s.cfg.QEMUVersion, Machine: qemu.MachineType, Accel: s.cfg.Accel,
		CPUModel: qemu.CPUModel(s.cfg.Accel), DeviceSet: deviceSet, HostBoot: qemu.BootID()}
}

// mayBeTorn reports whether a saved state may have lost writes: the host
// has rebooted since it was saved, and it had not reached the disk by then
// (no qemu.SyncState marker). Saves do not wait for the disk; this is what
// a host crash right after one costs.
func mayBeTorn(saved *store.SavedBy, bootNow string, synced bool) bool {
	return saved != nil && saved.HostBoot != "" && bootNow != "" && saved.HostBoot != bootNow && !synced
}

// syncSaved makes a saved state durable after its save (see qemu.SyncState).
func (s *Service) syncSaved(vmID, path string) {
	s.syncs.Add(1)
	go func() {
		defer s.syncs.Done()
		if err := qemu.SyncState(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("saved state not synced to disk", "vm", vmID, "state", path, "err", err)
		}
	}()
}

// knownDeviceSet says whether this agentvm can start a QEMU with device set ds.
func knownDeviceSet(ds string) bool {
	return ds == qemu.DeviceSet || ds == qemu.CPUHotplugDeviceSet || ds == qemu.LegacyDeviceSet
}

// checkRestorable decides whether a QEMU described by here can load a state
// written as saved describes. QEMU migrates forward only: a state of an older
// (or the same) QEMU loads on the same machine type, accelerator, CPU model
// and device set; a newer QEMU's state, or another machine's, does not.
// here.DeviceSet is ignored: the restore plugs the state's own device set,
// which must be one this agentvm knows.
func checkRestorable(what string, saved, here store.SavedBy) error {
	fail := func(format string, a ...any) error {
		return &StateIncompatibleError{What: what, Saved: saved, Here: here, Why: fmt.Sprintf(format, a...)}
	}
	if saved.Machine != here.Machine || saved.Accel != here.Accel || saved.CPUModel != here.CPUModel {
		return fail("it was saved by QEMU %s on machine type %s under %s (CPU model %s) and this server runs QEMU %s on %s under %s (CPU model %s); "+
			"a state restores only on the same machine type, accelerator and CPU model",
			saved.QEMU, saved.Machine, saved.Accel, saved.CPUModel, here.QEMU, here.Machine, here.Accel, here.CPUModel)
	}
	if !knownDeviceSet(saved.DeviceSet) {
		return fail("it was saved by QEMU %s with a device set this agentvm does not know (%q); it cannot be restored here", saved.QEMU, saved.DeviceSet)
	}
	sv, err1 := parseVersion(saved.QEMU)
	hv, err2 := parseVersion(here.QEMU)
	if err1 != nil || err2 != nil {
		return fail("cannot compare the QEMU version that saved it (%q) with this server's (%q)", saved.QEMU, here.QEMU)
	}
	if compareVersions(sv, hv) > 0 {
		return fail("it was saved by QEMU %s, newer than this server's QEMU %s; QEMU restores states of its own and older versions only: "+
			"restore it on a server running QEMU %s or newer (agentvm serve --qemu PATH)", saved.QEMU, here.QEMU, saved.QEMU)
	}
	return nil
}

// parseVersion reads "major.minor.micro" (micro optional).
func parseVersion(v string) ([3]int, error) {
	var out [3]int
	parts := strings.Split(v, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return out, fmt.Errorf("QEMU version %q is not major.minor[.micro]", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, fmt.Errorf("QEMU version %q is not major.minor[.micro]", v)
		}
		out[i] = n
	}
	return out, nil
}

func compareVersions(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// snapshotRestoreLayout is the device set to restore snapshot sn with, or
// why it cannot be restored here. A snapshot taken by this QEMU is known by
// its key; one that records the QEMU that took it follows checkRestorable;
// an older record without it, of another QEMU, cannot be told apart.
func (s *Service) snapshotRestoreLayout(sn *store.Snapshot) (string, error) {
	if ds := s.snapshotLayout(sn); ds != "" {
		return ds, nil
	}
	what := "snapshot " + sn.Name
	if sn.SavedBy == nil {
		return "", &StateIncompatibleError{What: what, Here: *s.savedByHere(""),
			Why: fmt.Sprintf("it was taken with another QEMU, accelerator or machine (this server runs QEMU %s on %s under %s) by an agentvm that did not record which; it cannot be restored here",
				s.cfg.QEMUVersion, qemu.MachineType, s.cfg.Accel)}
	}
	if err := checkRestorable(what, *sn.SavedBy, *s.savedByHere("")); err != nil {
		return "", err
	}
	return sn.SavedBy.DeviceSet, nil
}

// checkSuspendedState says why a suspended VM's state cannot be restored
// here (nil when it can, or when its record predates SavedBy: the restore
// then tries, and a QEMU that refuses it leaves the VM suspended).
func (s *Service) checkSuspendedState(v *store.VM) error {
	if v.SavedBy == nil {
		return nil
	}
	return checkRestorable("VM "+v.Name+"'s suspended state", *v.SavedBy, *s.savedByHere(""))
}
