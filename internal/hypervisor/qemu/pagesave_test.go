package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// bareQEMU starts QEMU without a guest kernel (paused, or given its own
// args) and connects QMP.
func bareQEMU(t *testing.T, ctx context.Context, dir, name string, memMiB int64, args ...string) *Machine {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	cfg := Config{MemoryMiB: memMiB, QMPSock: filepath.Join(dir, name+".qmp"), LogPath: filepath.Join(dir, name+".log")}
	a := append([]string{"-machine", MachineType + ",memory-backend=mem", "-m", "32M", "-accel", "tcg",
		"-nodefaults", "-display", "none", "-qmp", "unix:" + cfg.QMPSock + ",server=on,wait=off"}, args...)
	logf, err := os.Create(cfg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, a...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &Machine{cfg: cfg, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { cmd.Wait(); close(m.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-m.done })
	if err := m.connect(ctx); err != nil {
		t.Fatalf("qemu %s did not come up: %v%s", name, err, LogTail(cfg.LogPath))
	}
	return m
}

// TestPagesSaveRestoreQEMU saves a guest's memory in the page format with
// the installed QEMU and restores it into another QEMU that maps the RAM
// file copy-on-write: every byte of guest RAM must come back, though the
// stream QEMU loads holds none of the main block's pages.
func TestPagesSaveRestoreQEMU(t *testing.T) {
	t.Run("stopped", func(t *testing.T) { pagesRoundTrip(t, false) })
	// A live save of a running guest (its firmware): pages are sent again
	// as the guest dirties them; the RAM compared is the one at the stop.
	t.Run("live", func(t *testing.T) { pagesRoundTrip(t, true) })
}

func pagesRoundTrip(t *testing.T, live bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	// Random content at two places in guest RAM (the generic loader copies
	// the files in at reset), the rest zero.
	var blobs []string
	for i := 0; i < 2; i++ {
		b := make([]byte, 256<<10)
		rand.Read(b)
		p := filepath.Join(dir, "blob"+string(rune('a'+i)))
		os.WriteFile(p, b, 0o600)
		blobs = append(blobs, p)
	}
	args := []string{"-object", "memory-backend-ram,id=mem,size=32M",
		"-device", "loader,file=" + blobs[0] + ",addr=0x200000", "-device", "loader,file=" + blobs[1] + ",addr=0x1234000"}
	if !live {
		args = append(args, "-S")
	}
	src := bareQEMU(t, ctx, dir, "src", 32, args...)
	// As in production: QEMU before 9.0 saves a TCG guest stop-and-copy
	// (see precopyUnreliable), later ones live.
	src.cfg.Accel = "tcg"
	state := filepath.Join(dir, "state")
	want := filepath.Join(dir, "want")
	dump := func() error {
		_, err := src.qmp.Execute(ctx, "pmemsave", map[string]any{"val": 0, "size": 32 << 20, "filename": want})
		return err
	}
	var res SaveResult
	var err error
	if live {
		res, err = src.SaveLive(ctx, state, FormatPages, dump) // dump runs with the guest stopped at the save's end
	} else if res, err = src.SaveStopped(ctx, state, FormatPages); err == nil {
		err = dump()
	}
	if err != nil {
		t.Fatalf("save: %v%s", err, LogTail(src.cfg.LogPath))
	}
	if res.Format != FormatPages {
		t.Fatalf("saved as %s", res.Format)
	}
	info, err := ReadStateInfo(state)
	if err != nil || info.Format != FormatPages {
		t.Fatalf("state info %+v %v", info, err)
	}
	if st, _ := os.Stat(state); st.Size() > 4<<20 {
		t.Errorf("state file of %d bytes: RAM pages left in it?", st.Size())
	}
	if used := DiskUsage(state); used > 8<<20 {
		t.Errorf("state takes %d bytes of disk for 512 KiB of data: not sparse", used)
	}

	a, _ := os.ReadFile(want)
	blob, _ := os.ReadFile(blobs[1])
	if !bytes.Equal(a[0x1234000:0x1234000+len(blob)], blob) {
		t.Fatal("the source's RAM does not hold the loaded blob: the test is broken")
	}
	// Mapped: the RAM file copy-on-write, the stream without its pages.
	mapped := restoreBare(t, ctx, dir, "mapped", "exec:tail -c +"+strconv.FormatInt(info.Offset+1, 10)+" "+shellQuote(state),
		"memory-backend-file,id=mem,size=32M,mem-path="+info.RAMPath+",share=off")
	compareRAM(t, a, mapped)
	// Eager: anonymous memory, the pages streamed back (writeEager).
	eager := filepath.Join(dir, "eager")
	f, err := os.Create(eager)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeEager(f, state); err != nil {
		t.Fatal(err)
	}
	f.Close()
	compareRAM(t, a, restoreBare(t, ctx, dir, "eager", "exec:cat "+shellQuote(eager), "memory-backend-ram,id=mem,size=32M"))
}

// restoreBare restores a state into a new bare QEMU with the given memory
// backend, the guest left stopped (running it would let its firmware write
// its RAM), and returns the guest's RAM.
func restoreBare(t *testing.T, ctx context.Context, dir, name, uri, backend string) []byte {
	t.Helper()
	dst := bareQEMU(t, ctx, dir, name, 32, "-S", "-incoming", "defer", "-object", backend)
	if _, err := dst.qmp.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := dst.Status(ctx)
		if err != nil {
			t.Fatalf("restore %s: %v%s", name, err, LogTail(dst.cfg.LogPath))
		}
		if st == "prelaunch" || st == "paused" {
			break
		}
		if st != "inmigrate" && st != "restore-vm" {
			t.Fatalf("restore %s ended in %s%s", name, st, LogTail(dst.cfg.LogPath))
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := filepath.Join(dir, name+".ram.dump")
	if _, err := dst.qmp.Execute(ctx, "pmemsave", map[string]any{"val": 0, "size": 32 << 20, "filename": got}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(got)
	return b
}

func compareRAM(t *testing.T, a, b []byte) {
	t.Helper()
	if !bytes.Equal(a, b) {
		n := 0
		for i := 0; i < len(a) && i < len(b); i += pageSize {
			if !bytes.Equal(a[i:i+pageSize], b[i:i+pageSize]) {
				n++
				t.Logf("page %#x differs: want %x got %x", i, a[i:i+8], b[i:i+8])
			}
		}
		t.Fatalf("restored RAM (%d bytes) differs from the saved RAM (%d bytes) in %d pages", len(b), len(a), n)
	}
}
