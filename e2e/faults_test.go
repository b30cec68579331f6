package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// TestQEMUKilledDuringOperations kills a VM's QEMU with SIGKILL at several
// points of a snapshot, a fork and a suspend. Each operation must end with
// a clear error (or succeed if it was done before the kill), the VM must
// be in a state that says what happened and come back with its files, a
// snapshot that is listed must restore, and nothing may be left behind:
// no QEMU that no record names, no snapshot files that no snapshot owns,
// no half-written suspend state.
func TestQEMUKilledDuringOperations(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	began := time.Now()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "k1"})
	writeMark(t, s, ctx, "k1")
	verified := map[string]bool{} // snapshots restored once already
	booted := map[string]bool{}   // operations whose crashed k1 was booted from its disk

	ops := []struct {
		name   string
		delays []time.Duration
		run    func(context.Context) error
	}{
		{"snapshot", []time.Duration{30 * time.Millisecond, 120 * time.Millisecond, 400 * time.Millisecond},
			func(c context.Context) error { _, err := s.Client.Snapshot(c, "k1", ""); return err }},
		{"fork", []time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 900 * time.Millisecond},
			func(c context.Context) error { _, err := s.Client.Fork(c, "k1", 1); return err }},
		{"suspend", []time.Duration{30 * time.Millisecond, 120 * time.Millisecond},
			func(c context.Context) error { _, err := s.Client.SuspendVM(c, "k1"); return err }},
	}
	for _, op := range ops {
		for _, d := range op.delays {
			stage := fmt.Sprintf("kill -9 of QEMU %v into %s", d, op.name)
			cur, err := s.Client.GetVM(ctx, "k1")
			if err != nil || cur.State != "running" || cur.PID == 0 {
				t.Fatalf("%s: k1 before the operation: %v %+v", stage, err, cur)
			}
			pid := cur.PID
			errc := make(chan error, 1)
			t0 := time.Now()
			go func() { errc <- op.run(ctx) }()
			time.Sleep(d) // where the fault lands; the checks below wait on conditions
			killed := false
			if isQEMUOf(pid, v.ID) {
				killed = syscall.Kill(pid, syscall.SIGKILL) == nil
			}
			var opErr error
			var opTook time.Duration
			select {
			case opErr = <-errc:
				opTook = time.Since(t0)
			case <-time.After(3 * time.Minute):
				t.Fatalf("%s: the operation did not return within 3 minutes after its QEMU was killed\n%s", stage, tailLog(s))
			}
			// The operation either finished before the kill or says why it
			// failed: QEMU exited under it, or (a kill that landed before
			// the operation took the VM) the VM was already crashed.
			if opErr != nil {
				var ae *client.APIError
				clear := errors.As(opErr, &ae) && strings.Contains(ae.Message, "k1") &&
					(regexp.MustCompile(`(?i)qemu.*(exited|died|killed)|(exited|died|killed).*qemu`).MatchString(ae.Message) ||
						ae.Status == 409 && strings.Contains(ae.Message, "it is crashed"))
				if !clear {
					t.Fatalf("%s: unclear error: %v", stage, opErr)
				}
			}
			// The VM settles: crashed (its QEMU was killed), or suspended
			// when the suspend was complete before the kill.
			var settled *api.VM
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
				settled, err = s.Client.GetVM(ctx, "k1")
				if err != nil {
					t.Fatalf("%s: get k1: %v", stage, err)
				}
				if settled.State == "crashed" || settled.State == "stopped" || settled.State == "suspended" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: k1 is still %s (pid %d) a minute after its QEMU %d was killed (op error: %v)", stage, settled.State, settled.PID, pid, opErr)
				}
			}
			switch {
			case settled.State == "suspended" && (op.name != "suspend" || opErr != nil):
				t.Fatalf("%s: k1 is suspended after a %s that returned %v", stage, op.name, opErr)
			case settled.State != "suspended" && op.name == "suspend" && opErr == nil:
				t.Fatalf("%s: the suspend succeeded but k1 is %s", stage, settled.State)
			case settled.State != "suspended" && !killed:
				t.Fatalf("%s: k1 is %s but its QEMU was not killed", stage, settled.State)
			case settled.State != "suspended" && settled.PID != 0:
				t.Fatalf("%s: k1 is %s with pid %d", stage, settled.State, settled.PID)
			}
			if settled.State == "crashed" && settled.Error == "" {
				t.Fatalf("%s: crashed without a reason", stage)
			}
			// A suspend leaves a complete state file only when it is recorded.
			dir := filepath.Join(s.DataDir, "vms", v.ID)
			if _, err := os.Stat(filepath.Join(dir, "suspend.state.tmp")); err == nil {
				t.Fatalf("%s: a half-written suspend state is left", stage)
			}
			if _, err := os.Stat(filepath.Join(dir, "suspend.state")); (err == nil) != (settled.State == "suspended") {
				t.Fatalf("%s: k1 is %s and its suspend state exists: %v", stage, settled.State, err == nil)
			}
			checkNoStrays(t, s, stage)
			checkSnapshotFiles(t, s, stage)
			tOp := time.Since(t0)

			// Bring it back: start boots a crashed VM from its disk, a wake
			// restores a suspended one. The checks of what the operation
			// made run meanwhile. A boot costs half a minute under TCG, so
			// only the first crash of each operation boots; after a later
			// one the disk layers it owns are checked (qemu-img check) and k1
			// is made again once the checks are done.
			replace := settled.State != "suspended" && booted[op.name]
			if settled.State != "suspended" {
				booted[op.name] = true
			}
			recovered := make(chan error, 1)
			go func() {
				var err error
				switch {
				case replace:
					err = checkVMLayers(s.DataDir, v.ID)
				case settled.State == "suspended":
					_, err = s.Client.WakeVM(ctx, "k1")
				default:
					_, err = s.Client.StartVM(ctx, "k1")
				}
				if err == nil && !replace {
					err = markErr(ctx, s, "k1")
				}
				recovered <- err
			}()

			// Fork children that made it run with the parent's files; then they go.
			vms, err := s.Client.ListVMs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			children := 0
			for _, c := range vms {
				if c.ID == v.ID {
					continue
				}
				if op.name != "fork" || c.State != "running" {
					t.Fatalf("%s: unexpected VM %s (%s) after a %s", stage, c.Name, c.State, op.name)
				}
				children++
				checkMark(t, s, ctx, c.Name, stage+": fork child")
				if err := s.Client.DeleteVM(ctx, c.ID); err != nil {
					t.Fatalf("%s: delete %s: %v", stage, c.Name, err)
				}
			}
			if op.name == "fork" && (opErr == nil) != (children == 1) {
				t.Fatalf("%s: the fork returned %v and left %d children", stage, opErr, children)
			}
			// Every listed snapshot restores, with the files it was taken with.
			snaps, err := s.Client.ListSnapshots(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if op.name == "snapshot" && opErr == nil && len(snaps) == len(verified) {
				t.Fatalf("%s: the snapshot succeeded but is not listed", stage)
			}
			for _, sn := range snaps {
				if verified[sn.ID] {
					continue
				}
				if op.name != "snapshot" || opErr != nil {
					t.Fatalf("%s: a snapshot %s appeared after a %s that returned %v", stage, sn.Name, op.name, opErr)
				}
				name := "r-" + strings.TrimPrefix(sn.ID, "snap-")
				if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: name, From: sn.ID}); err != nil {
					t.Fatalf("%s: snapshot %s is listed but does not restore: %v", stage, sn.Name, err)
				}
				checkMark(t, s, ctx, name, stage+": restore of "+sn.Name)
				if err := s.Client.DeleteVM(ctx, name); err != nil {
					t.Fatal(err)
				}
				verified[sn.ID] = true
			}
			select {
			case err = <-recovered:
			case <-time.After(5 * time.Minute):
				err = fmt.Errorf("not back after 5 minutes")
			}
			if err != nil {
				t.Fatalf("%s: bring k1 back from %s: %v\n%s", stage, settled.State, err, tailLog(s))
			}
			if replace {
				if err := s.Client.DeleteVM(ctx, "k1"); err != nil {
					t.Fatalf("%s: delete the crashed k1: %v", stage, err)
				}
				v = s.CreateVM(ctx, api.CreateVMRequest{Name: "k1"})
				writeMark(t, s, ctx, "k1")
			}
			if got, err := s.Client.GetVM(ctx, "k1"); err != nil || got.State != "running" || got.PID == 0 {
				t.Fatalf("%s: k1 after recovery: %v %+v", stage, err, got)
			}
			checkNoStrays(t, s, stage+", after recovery")
			t.Logf("%s: the %s returned after %v: %v; k1 was %s; recovery and checks %v", stage, op.name, opTook.Round(time.Millisecond), opErr, settled.State,
				(time.Since(t0) - tOp).Round(time.Millisecond))
		}
	}
	t.Logf("total %v", time.Since(began).Round(time.Second))
}

// TestDiskFullDuringSuspendAndSnapshot runs the server on a small tmpfs
// that is filled up after a VM is created: a snapshot and a suspend have no
// room for the memory state. Both must fail clearly, leave the VM running
// with its files, leave no partial state, and the server must go on
// working; once there is room again both succeed.
func TestDiskFullDuringSuspendAndSnapshot(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Room for a 512 MiB VM's create (the server wants 512 MiB free to
	// admit one) and, once the filler is gone, for a snapshot, a suspend
	// and a restore.
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1280m,mode=0700"); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot mount a tmpfs: %v", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			err := syscall.Unmount(dir, 0)
			if err == nil {
				return
			}
			if i == 50 {
				t.Errorf("unmount %s: %v; detaching it", dir, err)
				syscall.Unmount(dir, syscall.MNT_DETACH)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	s := testenv.Start(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "full"})
	other := s.CreateVM(ctx, api.CreateVMRequest{Name: "other"})
	// Both guests write to their disks all the time, so a write that meets
	// the disk a save has filled stops the guest (QEMU's werror=enospc)
	// unless the daemon gives the space back first; "other" is a bystander.
	for _, name := range []string{"full", "other"} {
		writeMark(t, s, ctx, name)
		if r := s.Exec(ctx, name, "nohup sh -c 'while :; do date >> /root/ticks; sync; sleep 0.05; done' >/dev/null 2>&1 &"); r.ExitCode != 0 {
			t.Fatalf("start a writer in %s: %+v", name, r)
		}
	}

	// Fill the file system, leaving a few MiB: the guest's disk writes and
	// the database still fit, a memory state of hundreds of MiB does not.
	filler := filepath.Join(dir, "filler")
	const leave = 16 << 20
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, freeBytes(t, dir)-leave); err != nil {
		t.Fatalf("fill the tmpfs: %v", err)
	}
	f.Close()
	t.Logf("tmpfs filled: %d MiB free", freeBytes(t, dir)>>20)
	layersBefore := dirNames(filepath.Join(dir, "layers"))

	full := regexp.MustCompile(`(?i)no space|disk full|not enough (disk )?space`)
	stillRunning := func(stage string) {
		t.Helper()
		for _, vm := range []*api.VM{v, other} {
			got, err := s.Client.GetVM(ctx, vm.ID)
			if err != nil || got.State != "running" || got.PID == 0 {
				t.Fatalf("%s: %s is not running: %v %+v\n%s", stage, vm.Name, err, got, tailLog(s))
			}
			if pids := testenv.QEMUProcesses(vm.ID); len(pids) != 1 || pids[0] != got.PID {
				t.Fatalf("%s: %s (pid %d) has QEMU processes %v", stage, vm.Name, got.PID, pids)
			}
			// The guest still writes to its disk: QEMU did not leave it stopped on a write error.
			ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			r, err := s.Client.Exec(ectx, vm.ID, api.ExecRequest{Shell: "cat /root/mark && echo more > /root/more && sync && cat /root/more"})
			cancel()
			if err != nil || r.ExitCode != 0 || r.Stdout != "kept\nmore\n" {
				vl, _ := os.ReadFile(filepath.Join(dir, "vms", vm.ID, "vm.log"))
				t.Fatalf("%s: exec in %s: %v %+v\nvm.log: %s\n%s", stage, vm.Name, err, r, testenv.Tail(string(vl), 3000), tailLog(s))
			}
		}
	}
	// noLeftovers checks what a failed save left; before is the free space
	// measured just before it (the guests' writers use a little more all
	// the time, so each save is judged against its own start: a save that
	// kept its partial state would leave next to nothing free).
	noLeftovers := func(stage string, before int64) {
		t.Helper()
		if snaps, err := s.Client.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
			t.Fatalf("%s: snapshots listed: %v %+v", stage, err, snaps)
		}
		if names := dirNames(filepath.Join(dir, "snapshots")); len(names) != 0 {
			t.Fatalf("%s: files left in snapshots/: %v", stage, names)
		}
		if names := dirNames(filepath.Join(dir, "vms", v.ID)); strings.Contains(strings.Join(names, " "), "suspend") {
			t.Fatalf("%s: suspend state left: %v", stage, names)
		}
		if got := dirNames(filepath.Join(dir, "layers")); strings.Join(got, " ") != strings.Join(layersBefore, " ") {
			t.Fatalf("%s: disk layers were %v, now %v", stage, layersBefore, got)
		}
		if free := freeBytes(t, dir); free < before/2 {
			t.Fatalf("%s: the failed save's space was not given back: %d MiB free, %d MiB before it", stage, free>>20, before>>20)
		}
	}

	before := freeBytes(t, dir)
	_, err = s.Client.Snapshot(ctx, "full", "")
	t.Logf("snapshot on a full disk: %v", err)
	if err == nil || !full.MatchString(err.Error()) {
		t.Fatalf("snapshot on a full disk: want a no-space error, got %v", err)
	}
	if !isStatus(err, 507) {
		t.Errorf("snapshot on a full disk: want HTTP 507, got %v", err)
	}
	noLeftovers("failed snapshot", before)
	stillRunning("failed snapshot")

	before = freeBytes(t, dir)
	_, err = s.Client.SuspendVM(ctx, "full")
	t.Logf("suspend on a full disk: %v", err)
	if err == nil || !full.MatchString(err.Error()) {
		t.Fatalf("suspend on a full disk: want a no-space error, got %v", err)
	}
	if !isStatus(err, 507) {
		t.Errorf("suspend on a full disk: want HTTP 507, got %v", err)
	}
	noLeftovers("failed suspend", before)
	stillRunning("failed suspend")

	// The database goes on working.
	if vms, err := s.Client.ListVMs(ctx); err != nil || len(vms) != 2 {
		t.Fatalf("list VMs on a full disk: %v %+v", err, vms)
	}
	tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: "full", Allow: []string{"exec"}, TTL: "10m"})
	if err != nil {
		t.Fatalf("create a token on a full disk: %v", err)
	}
	if r, err := client.New(s.URL, tok.Secret).Exec(ctx, "full", api.ExecRequest{Shell: "cat /root/mark"}); err != nil || r.Stdout != "kept\n" {
		t.Fatalf("exec with the new token: %v %+v", err, r)
	}
	if toks, err := s.Client.ListTokens(ctx, "full"); err != nil || len(toks) != 1 {
		t.Fatalf("list tokens: %v %+v", err, toks)
	}

	// With room again, both work.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	sn, err := s.Client.Snapshot(ctx, "full", "after")
	if err != nil {
		t.Fatalf("snapshot with room again: %v", err)
	}
	if sv, err := s.Client.SuspendVM(ctx, "full"); err != nil || sv.State != "suspended" {
		t.Fatalf("suspend with room again: %v %+v", err, sv)
	}
	if w, err := s.Client.WakeVM(ctx, "full"); err != nil || w.State != "running" {
		t.Fatalf("wake: %v %+v", err, w)
	}
	stillRunning("after a suspend with room again")
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "again", From: sn.ID}); err != nil {
		t.Fatalf("restore the snapshot: %v", err)
	}
	checkMark(t, s, ctx, "again", "restore of the snapshot taken with room again")
	checkNoStrays(t, s, "end")
	for _, vm := range []*api.VM{v, other} {
		l, _ := s.Client.Logs(ctx, vm.ID)
		t.Logf("%s: resumed %d times after QEMU stopped it on the full disk", vm.Name, strings.Count(l, "when a disk write found the data dir full"))
	}
}

// checkVMLayers runs qemu-img check on every disk layer a VM owns (its
// writable top and the frozen layers below it, <data>/layers/<id>-*.qcow2):
// a crash must leave each of them consistent.
func checkVMLayers(dataDir, id string) error {
	qemuImg := "qemu-img"
	if q := os.Getenv("AGENTVM_QEMU"); q != "" {
		qemuImg = filepath.Join(filepath.Dir(q), "qemu-img") // the suite's QEMU's own, beside it
		if _, err := os.Stat(qemuImg); err != nil {
			qemuImg = "qemu-img"
		}
	}
	layers, _ := filepath.Glob(filepath.Join(dataDir, "layers", id+"-*.qcow2"))
	if len(layers) == 0 {
		return fmt.Errorf("no disk layer of %s in %s/layers", id, dataDir)
	}
	for _, l := range layers {
		out, err := exec.Command(qemuImg, "check", "-U", l).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			continue // leaked clusters only: space a kill -9 may leave, no corruption
		}
		if err != nil {
			return fmt.Errorf("qemu-img check %s: %v\n%s", l, err, out)
		}
	}
	return nil
}

func writeMark(t *testing.T, s *testenv.Server, ctx context.Context, vm string) {
	t.Helper()
	if r := s.Exec(ctx, vm, "echo kept > /root/mark && sync"); r.ExitCode != 0 {
		t.Fatalf("write mark: %+v", r)
	}
}

func markErr(ctx context.Context, s *testenv.Server, vm string) error {
	ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := s.Client.Exec(ectx, vm, api.ExecRequest{Shell: "cat /root/mark"})
	if err == nil && (r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "kept") {
		err = fmt.Errorf("%s lost its mark: %+v", vm, r)
	}
	return err
}

func checkMark(t *testing.T, s *testenv.Server, ctx context.Context, vm, stage string) {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := s.Client.Exec(ectx, vm, api.ExecRequest{Shell: "cat /root/mark"})
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "kept" {
		t.Fatalf("%s: %s lost its mark: %v %+v\n%s", stage, vm, err, r, tailLog(s))
	}
}

// checkNoStrays fails unless the QEMU processes running on the server's
// data dir are exactly those its VM records name.
func checkNoStrays(t *testing.T, s *testenv.Server, stage string) {
	t.Helper()
	vms, err := s.Client.ListVMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, v := range vms {
		want[v.ID] = v.PID
	}
	for id, pids := range dataDirQEMUs(s.DataDir) {
		pid, known := want[id]
		if !known || len(pids) != 1 || pids[0] != pid {
			t.Fatalf("%s: QEMU processes %v of %s, whose record (known %v) names pid %d", stage, pids, id, known, pid)
		}
	}
	for _, v := range vms {
		if v.PID != 0 && len(dataDirQEMUs(s.DataDir)[v.ID]) == 0 {
			t.Fatalf("%s: %s is %s with pid %d, which is not running", stage, v.Name, v.State, v.PID)
		}
	}
}

// checkSnapshotFiles fails if snapshots/ holds anything no listed snapshot owns.
func checkSnapshotFiles(t *testing.T, s *testenv.Server, stage string) {
	t.Helper()
	snaps, err := s.Client.ListSnapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string]bool{}
	for _, sn := range snaps {
		owned[sn.ID] = true
	}
	for _, n := range dirNames(filepath.Join(s.DataDir, "snapshots")) {
		if !owned[n] {
			t.Fatalf("%s: snapshots/%s belongs to no snapshot (listed: %d)", stage, n, len(snaps))
		}
	}
}

var guestNameRe = regexp.MustCompile(`\x00guest=([^,\x00]+),`)

// dataDirQEMUs maps VM ids to the pids of live QEMU processes whose command
// line names dataDir (their disk and log are there).
func dataDirQEMUs(dataDir string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte("qemu-system")) || !bytes.Contains(b, []byte(dataDir+"/")) {
			continue
		}
		if m := guestNameRe.FindSubmatch(b); m != nil {
			out[string(m[1])] = append(out[string(m[1])], pid)
		}
	}
	return out
}

// qemuPID is the pid of VM id's QEMU in qemus (dataDirQEMUs), 0 if none.
func qemuPID(qemus map[string][]int, id string) int {
	if pids := qemus[id]; len(pids) > 0 {
		return pids[0]
	}
	return 0
}

func isQEMUOf(pid int, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte("qemu-system")) && bytes.Contains(b, []byte("\x00guest="+id+","))
}

func dirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
