package qemu

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// pluggedQMP answers qom-get of the virtio-mem device's size with reply
// (a JSON value, or "" for an error) and counts the questions.
func pluggedQMP(t *testing.T, reply string, asked *atomic.Int32) *QMP {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	serveFakeQMP(t, sock, func(m qmpCall) ([]string, bool) {
		if m.Execute != "qom-get" || m.Arguments["property"] != "size" {
			return []string{qmpReturn(m, `{}`)}, false
		}
		asked.Add(1)
		if reply == "" {
			return []string{qmpError(m, "DeviceNotFound", "no such device")}, false
		}
		return []string{qmpReturn(m, reply)}, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := DialQMP(ctx, sock, func(Event) {})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestPrecopyAbortsOnPlugged(t *testing.T) {
	for _, c := range []struct {
		name, accel, layout, reply string
		want, asks                 bool
	}{
		{"tcg, 1 GiB plugged", "tcg", DeviceSet, "1073741824", true, true},
		{"tcg, nothing plugged", "tcg", DeviceSet, "0", false, true},
		{"tcg, size unreadable", "tcg", "", "", true, true},
		{"kvm, plugged", "kvm", DeviceSet, "1073741824", false, false},
		{"tcg, no virtio-mem device", "tcg", CPUHotplugDeviceSet, "", false, false},
		{"tcg, legacy device set", "tcg", LegacyDeviceSet, "", false, false},
	} {
		var asked atomic.Int32
		m := &Machine{cfg: Config{Accel: c.accel, Layout: c.layout}, qmp: pluggedQMP(t, c.reply, &asked)}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got := m.precopyAbortsOnPlugged(ctx)
		cancel()
		if got != c.want || (asked.Load() > 0) != c.asks {
			t.Errorf("%s: %v (asked QEMU %d times), want %v", c.name, got, asked.Load(), c.want)
		}
	}
}
