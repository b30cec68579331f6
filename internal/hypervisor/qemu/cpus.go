package qemu

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

// HotplugCPUs is how many vCPUs a VM can grow to while it runs: every
// machine gets -smp N,maxcpus=max(N, HotplugCPUs).
const HotplugCPUs = 16

// MaxCPUs is the maxcpus of a machine with n vCPUs. It only depends on n,
// and a running VM only grows up to it, so a VM's restore command line
// (-smp with its current count) always matches the machine it was saved from.
func MaxCPUs(n int) int { return max(n, HotplugCPUs) }

// MaxCPUsFor is MaxCPUs for a machine of the given layout (Config.Layout):
// a legacy machine has no room to grow.
func MaxCPUsFor(layout string, n int) int {
	if layout == LegacyDeviceSet {
		return n
	}
	return MaxCPUs(n)
}

type hotpluggableCPU struct {
	Type    string         `json:"type"`
	Props   map[string]int `json:"props"`
	QOMPath string         `json:"qom-path"`
}

// AddCPUs hot-adds vCPUs until want are present. They are added in the
// order of their topology ids, which is the order of their CPU indexes, so
// that the saved state of the machine loads into a QEMU started with
// "-smp want": its vCPUs 0..want-1 are the same ones, cold-plugged. It
// returns how many vCPUs are present afterwards.
func (m *Machine) AddCPUs(ctx context.Context, want int) (int, error) {
	raw, err := m.qmp.Execute(ctx, "query-hotpluggable-cpus", nil)
	if err != nil {
		return 0, err
	}
	var cpus []hotpluggableCPU
	if err := json.Unmarshal(raw, &cpus); err != nil {
		return 0, fmt.Errorf("query-hotpluggable-cpus: %w", err)
	}
	present := 0
	var free []hotpluggableCPU
	for _, c := range cpus {
		if c.QOMPath != "" {
			present++
		} else {
			free = append(free, c)
		}
	}
	if want > present+len(free) {
		return present, fmt.Errorf("the machine has room for %d vCPUs, not %d", present+len(free), want)
	}
	slices.SortFunc(free, func(a, b hotpluggableCPU) int {
		for _, k := range []string{"socket-id", "die-id", "core-id", "thread-id"} {
			if c := cmp.Compare(a.Props[k], b.Props[k]); c != 0 {
				return c
			}
		}
		return 0
	})
	for _, c := range free {
		if present >= want {
			break
		}
		args := map[string]any{"driver": c.Type, "id": fmt.Sprintf("vcpu%d", present)}
		for k, v := range c.Props {
			args[k] = v
		}
		if _, err := m.qmp.Execute(ctx, "device_add", args); err != nil {
			return present, fmt.Errorf("add vCPU %d: %w", present, err)
		}
		present++
	}
	return present, nil
}

// PresentCPUs is how many vCPUs the machine has now.
func (m *Machine) PresentCPUs(ctx context.Context) (int, error) {
	raw, err := m.qmp.Execute(ctx, "query-cpus-fast", nil)
	if err != nil {
		return 0, err
	}
	var cpus []json.RawMessage
	if err := json.Unmarshal(raw, &cpus); err != nil {
		return 0, fmt.Errorf("query-cpus-fast: %w", err)
	}
	return len(cpus), nil
}

// RunningLayout tells the device set of a running QEMU from its command
// line (a QEMU started by an earlier agentvm, before an upgrade, keeps its
// own), or "" when it cannot be read.
func RunningLayout(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	switch {
	case err != nil, len(b) == 0: // gone, or a zombie or mid-exec
		return ""
	case bytes.Contains(b, []byte("virtio-mem-pci,")):
		return DeviceSet
	case bytes.Contains(b, []byte("maxcpus=")):
		return CPUHotplugDeviceSet
	}
	return LegacyDeviceSet
}
