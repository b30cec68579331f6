package vm

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/store"
)

func TestCheckRestorable(t *testing.T) {
	base := store.SavedBy{QEMU: "7.2.22", Machine: qemu.MachineType, Accel: "tcg", CPUModel: "max", DeviceSet: qemu.DeviceSet}
	with := func(f func(*store.SavedBy)) store.SavedBy { c := base; f(&c); return c }
	for _, c := range []struct {
		name        string
		saved, here store.SavedBy
		ok          bool
		mention     []string
	}{
		{"same QEMU", base, base, true, nil},
		{"older micro loads on newer", base, with(func(s *store.SavedBy) { s.QEMU = "7.2.23" }), true, nil},
		{"7.2 loads on 10.0", base, with(func(s *store.SavedBy) { s.QEMU = "10.0.2" }), true, nil},
		{"9.2 loads on 10.0", with(func(s *store.SavedBy) { s.QEMU = "9.2.0" }), with(func(s *store.SavedBy) { s.QEMU = "10.0.2" }), true, nil},
		{"older device sets load", with(func(s *store.SavedBy) { s.DeviceSet = qemu.LegacyDeviceSet }), with(func(s *store.SavedBy) { s.QEMU = "10.0.2" }), true, nil},
		{"the current device set is not required of the saved one", base, with(func(s *store.SavedBy) { s.DeviceSet = qemu.LegacyDeviceSet }), true, nil},
		{"10.0 does not load on 7.2", with(func(s *store.SavedBy) { s.QEMU = "10.0.2" }), base, false, []string{"10.0.2", "7.2.22", "newer"}},
		{"newer micro does not load", with(func(s *store.SavedBy) { s.QEMU = "7.2.23" }), base, false, []string{"7.2.23", "7.2.22"}},
		{"10.1 does not load on 10.0", with(func(s *store.SavedBy) { s.QEMU = "10.1" }), with(func(s *store.SavedBy) { s.QEMU = "10.0.9" }), false, []string{"10.1", "10.0.9"}},
		{"another machine type", with(func(s *store.SavedBy) { s.Machine = "pc-q35-9.2" }), base, false, []string{"pc-q35-9.2", qemu.MachineType}},
		{"another accelerator", with(func(s *store.SavedBy) { s.Accel, s.CPUModel = "kvm", "host" }), base, false, []string{"kvm", "tcg", "7.2.22"}},
		{"another CPU model", with(func(s *store.SavedBy) { s.CPUModel = "Skylake-Server" }), base, false, []string{"Skylake-Server", "max"}},
		{"an unknown device set", with(func(s *store.SavedBy) { s.DeviceSet = "ds99:future" }), base, false, []string{"ds99:future"}},
		{"an unreadable version", with(func(s *store.SavedBy) { s.QEMU = "ten" }), base, false, []string{`"ten"`}},
		{"an empty version", with(func(s *store.SavedBy) { s.QEMU = "" }), base, false, nil},
		{"a version with four parts", with(func(s *store.SavedBy) { s.QEMU = "7.2.22.1" }), base, false, nil},
		{"a negative version", with(func(s *store.SavedBy) { s.QEMU = "7.-2" }), base, false, nil},
	} {
		err := checkRestorable("snapshot s1", c.saved, c.here)
		if c.ok {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: restorable, want an error", c.name)
			continue
		}
		if !errors.Is(err, ErrStateIncompatible) || !errors.Is(err, ErrConflict) || !strings.HasPrefix(err.Error(), "snapshot s1: ") {
			t.Errorf("%s: %v is not a state-incompatible conflict about snapshot s1", c.name, err)
		}
		for _, m := range c.mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not mention %q", c.name, err, m)
			}
		}
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string][3]int{"7.2.22": {7, 2, 22}, "10.0": {10, 0, 0}, "10.0.2": {10, 0, 2}} {
		if got, err := parseVersion(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	for _, in := range []string{"", "7", "a.b", "7.2.x", "1.2.3.4", "7..2", " 7.2"} {
		if _, err := parseVersion(in); err == nil {
			t.Errorf("%q parsed", in)
		}
	}
}

// A snapshot's restore layout: its own key first, then what it records.
func TestSnapshotRestoreLayout(t *testing.T) {
	s := &Service{cfg: Config{QEMUVersion: "10.0.2", Accel: "tcg"}}
	here := s.savedByHere(qemu.DeviceSet)
	own := &store.Snapshot{Name: "own", CPUs: 2, MemoryMiB: 1024, Key: s.shapeKeyFor(qemu.CPUHotplugDeviceSet, 2, 1024)}
	if ds, err := s.snapshotRestoreLayout(own); err != nil || ds != qemu.CPUHotplugDeviceSet {
		t.Errorf("own snapshot: %q %v", ds, err)
	}
	older := &store.Snapshot{Name: "older", CPUs: 2, MemoryMiB: 1024, Key: "from-7.2",
		SavedBy: &store.SavedBy{QEMU: "7.2.22", Machine: here.Machine, Accel: "tcg", CPUModel: here.CPUModel, DeviceSet: qemu.LegacyDeviceSet}}
	if ds, err := s.snapshotRestoreLayout(older); err != nil || ds != qemu.LegacyDeviceSet {
		t.Errorf("7.2 snapshot on 10.0.2: %q %v", ds, err)
	}
	newer := &store.Snapshot{Name: "newer", CPUs: 2, MemoryMiB: 1024, Key: "from-10.1",
		SavedBy: &store.SavedBy{QEMU: "10.1.0", Machine: here.Machine, Accel: "tcg", CPUModel: here.CPUModel, DeviceSet: qemu.DeviceSet}}
	if _, err := s.snapshotRestoreLayout(newer); !errors.Is(err, ErrStateIncompatible) || !strings.Contains(err.Error(), "10.1.0") || !strings.Contains(err.Error(), "10.0.2") {
		t.Errorf("10.1 snapshot on 10.0.2: %v", err)
	}
	unrecorded := &store.Snapshot{Name: "old-record", CPUs: 2, MemoryMiB: 1024, Key: "from-elsewhere"}
	if _, err := s.snapshotRestoreLayout(unrecorded); !errors.Is(err, ErrStateIncompatible) || !strings.Contains(err.Error(), "10.0.2") {
		t.Errorf("snapshot without a record of its QEMU: %v", err)
	}
	v := &store.VM{Name: "box", SavedBy: newer.SavedBy}
	if err := s.checkSuspendedState(v); !errors.Is(err, ErrStateIncompatible) || !strings.Contains(err.Error(), "box") {
		t.Errorf("suspended by 10.1: %v", err)
	}
	v.SavedBy = older.SavedBy
	if err := s.checkSuspendedState(v); err != nil {
		t.Errorf("suspended by 7.2: %v", err)
	}
}

func TestMayBeTorn(t *testing.T) {
	saved := &store.SavedBy{HostBoot: "boot-a"}
	for _, c := range []struct {
		name   string
		saved  *store.SavedBy
		now    string
		synced bool
		want   bool
	}{
		{"same boot, not yet synced", saved, "boot-a", false, false},
		{"host rebooted, synced", saved, "boot-b", true, false},
		{"host rebooted before the sync", saved, "boot-b", false, true},
		{"a record from before boot ids", &store.SavedBy{}, "boot-b", false, false},
		{"no record", nil, "boot-b", false, false},
		{"boot id unreadable", saved, "", false, false},
	} {
		if got := mayBeTorn(c.saved, c.now, c.synced); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestStateFormats(t *testing.T) {
	stored := Config{Objects: &objects.Store{}, Node: "node-a"} // a cluster node that stores suspended VMs
	for _, c := range []struct {
		setting, suspend, capture string
		cfg                       Config
	}{
		{"", qemu.FormatStream, qemu.FormatPages, Config{}},
		{StateFormatAuto, qemu.FormatStream, qemu.FormatPages, Config{}},
		{qemu.FormatMapped, qemu.FormatMapped, qemu.FormatPages, Config{}},
		{qemu.FormatMapped, qemu.FormatStream, qemu.FormatPages, stored},
		{qemu.FormatPages, qemu.FormatPages, qemu.FormatPages, Config{}},
		{qemu.FormatStream, qemu.FormatStream, qemu.FormatStream, Config{}},
		{qemu.FormatPages, qemu.FormatPages, qemu.FormatPages, stored},
	} {
		if err := ValidStateFormat(c.setting); err != nil {
			t.Errorf("%q refused: %v", c.setting, err)
		}
		c.cfg.StateFormat = c.setting
		s := &Service{cfg: c.cfg}
		if s.suspendFormat() != c.suspend || s.captureFormat() != c.capture {
			t.Errorf("%q: suspend %s, capture %s; want %s, %s", c.setting, s.suspendFormat(), s.captureFormat(), c.suspend, c.capture)
		}
	}
	if err := ValidStateFormat("mapped"); err == nil {
		t.Error("an unknown state format accepted")
	}
}
