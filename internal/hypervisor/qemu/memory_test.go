package qemu

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Only the current device set has the virtio-mem device, and a restore
// plugs what the saved machine had.
func TestMemoryDeviceArgs(t *testing.T) {
	c := Config{ID: "vm-1", Accel: "tcg", CPUModel: "max", CPUs: 2, MemoryMiB: 1024, PluggedMiB: 3072}
	got := strings.Join(c.Args(), " ")
	for _, want := range []string{"-m 1024M,maxmem=17408M", "memory-backend-ram,id=mem,size=1024M",
		"memory-backend-ram,id=vmem0ram,size=16384M", "virtio-mem-pci,id=vmem0,memdev=vmem0ram,node=0,block-size=2M,requested-size=3072M"} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
	for _, l := range []string{CPUHotplugDeviceSet, LegacyDeviceSet} {
		c.Layout = l
		got := strings.Join(c.Args(), " ")
		if strings.Contains(got, "virtio-mem") || strings.Contains(got, "maxmem") || !strings.Contains(got, "-m 1024M ") {
			t.Errorf("%s has memory hotplug: %s", l, got)
		}
	}
	if MaxHotplugMiB(DeviceSet) != HotplugMemoryMiB || MaxHotplugMiB("") != HotplugMemoryMiB || MaxHotplugMiB(CPUHotplugDeviceSet) != 0 {
		t.Error("MaxHotplugMiB")
	}
}

// A running QEMU's device set is told from its command line.
func TestRunningLayout(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-smp", "1,maxcpus=16", "-device", "virtio-mem-pci,id=vmem0"}, DeviceSet},
		{[]string{"-smp", "1,maxcpus=16"}, CPUHotplugDeviceSet},
		{[]string{"-smp", "1"}, LegacyDeviceSet},
	} {
		cmd := exec.Command("sh", append([]string{"-c", "sleep 30; true", "sh"}, c.args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Start can return before the new program's arguments are in
		// /proc (an empty cmdline reads as unknown): wait for them.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)); bytes.Contains(b, []byte("sleep 30")) {
				break
			}
		}
		got := RunningLayout(cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
	if got := RunningLayout(-1); got != "" {
		t.Errorf("no process: %q", got)
	}
}
