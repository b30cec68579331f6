package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// seedState writes 200 files with their checksums, starts a counter process and an
// HTTP server: the running state that pause, suspend, snapshot and fork must keep.
func seedState(t *testing.T, s *testenv.Server, ctx context.Context, vm string) {
	t.Helper()
	r := s.Exec(ctx, vm, `mkdir -p /data && for i in $(seq 200); do head -c 8192 /dev/urandom > /data/f$i; done && sha256sum /data/f* > /root/sums || exit 1
nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /root/counter.new; mv /root/counter.new /root/counter; sleep 0.2; done' >/dev/null 2>&1 &
nohup python3 -m http.server 8000 --directory /data >/dev/null 2>&1 &
sync; echo seeded`)
	if !strings.Contains(r.Stdout, "seeded") {
		t.Fatalf("seed: %+v", r)
	}
}

func counter(t *testing.T, s *testenv.Server, ctx context.Context, vm string) int {
	t.Helper()
	var n int
	fmtSscan(s.Exec(ctx, vm, "cat /root/counter").Stdout, &n)
	return n
}

// verifyState checks the files, that the counter runs on from at least min, and
// that the HTTP server in the VM answers.
func verifyState(t *testing.T, s *testenv.Server, ctx context.Context, vm string, min int) int {
	t.Helper()
	if r := s.Exec(ctx, vm, "sha256sum -c --quiet /root/sums && ls /data | wc -l"); r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "200" {
		t.Fatalf("%s: files changed: %+v", vm, r)
	}
	c1 := counter(t, s, ctx, vm)
	if c1 < min {
		t.Fatalf("%s: counter went back: was >= %d, now %d", vm, min, c1)
	}
	var c2 int
	waitUntil(t, vm+"'s counter to run on", time.Minute, func() (bool, string) {
		c2 = counter(t, s, ctx, vm)
		return c2 > c1, fmt.Sprintf("%d, then %d", c1, c2)
	})
	var body string
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(body, "200 OK") && time.Now().Before(deadline); {
		if conn, err := s.Client.DialTCP(ctx, vm, 8000); err == nil {
			fmt.Fprint(conn, "HEAD /f1 HTTP/1.0\r\n\r\n")
			b := make([]byte, 512)
			n, _ := readAll(conn, b)
			conn.Close()
			body = string(b[:n])
		}
		if !strings.Contains(body, "200 OK") {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if !strings.Contains(body, "200 OK") {
		t.Fatalf("%s: HTTP server in the VM does not answer: %q", vm, body)
	}
	return c2
}

func TestPauseSuspendWake(t *testing.T) {
	t.Parallel()
	// Suspends with QEMU's mapped-ram (a stream on a QEMU before 9.0, the
	// smoke run's); the default stream format is suspended and woken by
	// the other tests.
	s := testenv.Start(t, "", "--state-format", "mapped-ram")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "life"})
	seedState(t, s, ctx, "life")
	last := verifyState(t, s, ctx, "life", 1)

	// pause: vCPUs frozen, exec resumes first
	out, _, code := s.CLI("", "pause", "life")
	if code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: %d %q", code, out)
	}
	time.Sleep(time.Second)
	if got, _ := s.Client.GetVM(ctx, "life"); got.State != "paused" {
		t.Fatalf("not paused: %+v", got)
	}
	last = verifyState(t, s, ctx, "life", last) // exec resumed it
	if got, _ := s.Client.GetVM(ctx, "life"); got.State != "running" {
		t.Fatalf("exec did not resume: %s", got.State)
	}
	if _, err := s.Client.PauseVM(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Client.ResumeVM(ctx, "life"); err != nil || got.State != "running" {
		t.Fatalf("resume: %v %+v", err, got)
	}

	// A guest clock gone wrong is set right by the wake.
	if r := s.Exec(ctx, "life", "date -s @1000000000"); r.ExitCode != 0 {
		t.Fatalf("date -s: %+v", r)
	}
	// suspend: QEMU exits, RAM is freed; concurrent requests share one wake
	sv, err := s.Client.SuspendVM(ctx, "life")
	if err != nil || sv.State != "suspended" || sv.Op == nil || sv.Op.Bytes == 0 {
		t.Fatalf("suspend: %v %+v", err, sv)
	}
	if pids := testenv.QEMUProcesses(v.ID); len(pids) != 0 {
		t.Fatalf("QEMU still running after suspend: %v", pids)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.Client.Exec(ctx, "life", api.ExecRequest{Shell: "cat /root/counter"})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exit %d", r.ExitCode)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("exec during wake: %v", err)
		}
	}
	// The wake set the guest's clock to this host's (in the agent's
	// handshake, or by an identity push to an older agent).
	before := time.Now()
	guestNow := strings.TrimSpace(s.Exec(ctx, "life", "date +%s.%N").Stdout)
	var secs float64
	if _, err := fmt.Sscanf(guestNow, "%f", &secs); err != nil {
		t.Fatalf("guest date: %q", guestNow)
	}
	if gt := time.Unix(0, int64(secs*1e9)); gt.Before(before.Add(-2*time.Second)) || gt.After(time.Now().Add(2*time.Second)) {
		t.Fatalf("guest clock %v after the wake, host %v: not set", gt, before)
	}
	logs, _, _ := s.CLI("", "logs", "life")
	if n := strings.Count(logs, "woke from suspend"); n != 1 {
		t.Fatalf("%d wakes for 4 concurrent requests", n)
	}
	// A QEMU from 9.0 on writes the suspend with its own mapped-ram (a
	// wake reads only the guest's pages); an older one falls back to a
	// stream.
	format := "stream format"
	var major int
	if fmt.Sscanf(vmQEMUVersion(t, s, ctx, "life"), "%d.", &major); major >= 9 {
		format = "mapped-ram format"
	}
	if !strings.Contains(logs, "suspended: ") || !strings.Contains(logs, format) {
		t.Fatalf("the suspend is not logged as %s:\n%s", format, logs)
	}
	// the counter continues from where it was (it did not restart from 1)
	last = verifyState(t, s, ctx, "life", last)
	// The woken QEMU saves again in the capture's format: a restore left
	// with mapped-ram on failed every later snapshot and fork (mapped-ram
	// needs a file, and the page format writes through a pipe).
	sn, err := s.Client.Snapshot(ctx, "life", "after-wake")
	if err != nil {
		t.Fatalf("snapshot of a woken VM: %v", err)
	}
	if err := s.Client.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}

	// inspect --wake wakes too
	s.Client.SuspendVM(ctx, "life")
	out, _, code = s.CLI("", "inspect", "--wake", "life")
	if code != 0 || !strings.Contains(out, `"state": "running"`) {
		t.Fatalf("inspect --wake: %q", out)
	}
	// and so does start
	s.Client.SuspendVM(ctx, "life")
	if out, _, code := s.CLI("", "start", "life"); code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("start of a suspended VM: %d %q", code, out)
	}

	// resize: the disk grows online, shrinking is refused, CPUs wait for a start
	r, err := s.Client.ResizeVM(ctx, "life", api.ResizeRequest{Disk: 10 << 30})
	if err != nil || r.DiskBytes != 10<<30 {
		t.Fatalf("resize disk: %v %+v", err, r)
	}
	var mb int
	fmtSscan(s.Exec(ctx, "life", "df -B1M --output=size / | tail -1").Stdout, &mb)
	if mb < 9500 {
		t.Fatalf("filesystem is %d MiB after growing to 10 GiB", mb)
	}
	if _, err := s.Client.ResizeVM(ctx, "life", api.ResizeRequest{Disk: 9 << 30}); !isStatus(err, 400) || !strings.Contains(err.Error(), "shrinking") {
		t.Fatalf("shrink: %v", err)
	}
	// vCPUs are hot-added to the running VM and come online at once
	r, err = s.Client.ResizeVM(ctx, "life", api.ResizeRequest{CPUs: 2})
	if err != nil || r.CPUs != 2 || r.NextCPUs != 0 || !strings.Contains(r.Op.Message, "hot-added") {
		t.Fatalf("resize cpus: %v %+v", err, r)
	}
	if got := strings.TrimSpace(s.Exec(ctx, "life", "nproc").Stdout); got != "2" {
		t.Fatalf("nproc after hot-adding a vCPU: %q", got)
	}
	// beyond the hotplug room: at the next start; memory grows live
	r, err = s.Client.ResizeVM(ctx, "life", api.ResizeRequest{CPUs: 40, Memory: 1 << 30})
	if err != nil || r.CPUs != 2 || r.NextCPUs != 40 || !strings.Contains(r.Op.Message, "next start") ||
		r.MemoryMiB != 1024 || r.NextMemoryMiB != 0 || !strings.Contains(r.Op.Message, "grown live") {
		t.Fatalf("resize beyond the hotplug room: %v %+v", err, r)
	}
	// fewer vCPUs and less memory: at the next start
	r, err = s.Client.ResizeVM(ctx, "life", api.ResizeRequest{CPUs: 1, Memory: 512 << 20})
	if err != nil || r.CPUs != 2 || r.NextCPUs != 1 || !strings.Contains(r.Op.Message, "never removed live") || r.NextMemoryMiB != 512 {
		t.Fatalf("resize to fewer vCPUs: %v %+v", err, r)
	}
	if r, err = s.Client.ResizeVM(ctx, "life", api.ResizeRequest{CPUs: 2, Memory: 1 << 30}); err != nil || r.NextCPUs != 0 || r.NextMemoryMiB != 0 || !strings.Contains(r.Op.Message, "cancelled") {
		t.Fatalf("back to the current count: %v %+v", err, r)
	}

	// graceful server shutdown suspends the VM; the next start wakes it
	s.Terminate()
	if pids := testenv.QEMUProcesses(v.ID); len(pids) != 0 {
		t.Fatalf("QEMU still running after a graceful shutdown: %v", pids)
	}
	s.Restart()
	waitState(t, s, "life", "running", 2*time.Minute)
	verifyState(t, s, ctx, "life", last)
	// the hot-added vCPU came back with the saved state
	if got := strings.TrimSpace(s.Exec(ctx, "life", "nproc").Stdout); got != "2" {
		t.Fatalf("nproc after suspend and wake: %q", got)
	}
	// and so did the memory grown live
	if got, _ := s.Client.GetVM(ctx, "life"); got == nil || got.MemoryMiB != 1024 {
		t.Fatalf("memory after suspend and wake: %+v", got)
	}
	waitMemTotal(t, s, ctx, "life", 850) // a 512 MiB guest shows under 400 MiB, +512 MiB plugged
}

func TestSnapshotAndFork(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	parent := s.CreateVM(ctx, api.CreateVMRequest{Name: "origin"})
	seedState(t, s, ctx, "origin")
	last := verifyState(t, s, ctx, "origin", 1)

	out, errOut, code := s.CLI("", "snapshot", "origin", "--name", "base")
	if code != 0 || strings.TrimSpace(out) != "base" {
		t.Fatalf("snapshot: %d %q %q", code, out, errOut)
	}
	if _, err := s.Client.Snapshot(ctx, "origin", "base"); !isStatus(err, 409) {
		t.Fatalf("duplicate snapshot name: %v", err)
	}
	out, _, _ = s.CLI("", "snapshots")
	if !strings.Contains(out, "base") {
		t.Fatalf("snapshots: %q", out)
	}
	// the parent keeps working after the snapshot, on its own disk top
	s.Exec(ctx, "origin", "echo after-snapshot > /root/late; sync")

	// create --from: same processes and files, fresh identity
	c, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "restored", From: "base"})
	if err != nil {
		t.Fatal(err)
	}
	verifyState(t, s, ctx, "restored", last)
	if r := s.Exec(ctx, "restored", "hostname; test -e /root/late && echo leaked || echo clean"); r.Stdout != "restored\nclean\n" {
		t.Fatalf("restored identity/disk: %q", r.Stdout)
	}
	if c.IP == parent.IP {
		t.Fatalf("restored VM shares the parent's address %s", c.IP)
	}
	mid := func(vm string) string { return s.Exec(ctx, vm, "cat /etc/machine-id").Stdout }
	if mid("restored") == mid("origin") {
		t.Fatal("restored VM shares the parent's machine-id")
	}

	// the snapshot outlives its source VM
	if err := s.Client.DeleteVM(ctx, "origin"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "second", From: "base"}); err != nil {
		t.Fatalf("create from a snapshot whose VM was deleted: %v", err)
	}
	verifyState(t, s, ctx, "second", last)
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{From: "base", Memory: 1 << 30}); !isStatus(err, 409) {
		t.Fatalf("create --from with another shape: %v", err)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{From: "nope"}); !isStatus(err, 404) {
		t.Fatalf("create --from unknown: %v", err)
	}

	// live fork: the parent keeps running; children get their own identity and disk
	// (and the parent's hot-added vCPU)
	if r, err := s.Client.ResizeVM(ctx, "restored", api.ResizeRequest{CPUs: 2}); err != nil || r.CPUs != 2 {
		t.Fatalf("hot-add before the fork: %v %+v", err, r)
	}
	before := counter(t, s, ctx, "restored")
	res, err := s.Client.Fork(ctx, "restored", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Children) != 2 || res.ParentPauseMs <= 0 || res.Parent.State != "running" {
		t.Fatalf("fork: %+v", res)
	}
	t.Logf("fork: parent paused %d ms, %d MiB of state, %d ms", res.ParentPauseMs, res.StateBytes>>20, res.TookMs)
	a, b := res.Children[0].Name, res.Children[1].Name
	for _, ch := range []string{a, b} {
		verifyState(t, s, ctx, ch, before)
		if got := strings.TrimSpace(s.Exec(ctx, ch, "nproc").Stdout); got != "2" || res.Children[0].CPUs != 2 {
			t.Fatalf("fork child %s: nproc %q, cpus %d", ch, got, res.Children[0].CPUs)
		}
	}
	verifyState(t, s, ctx, "restored", before)
	s.Exec(ctx, a, "echo only-a > /data/f1; sync")
	for _, other := range []string{"restored", b} {
		if r := s.Exec(ctx, other, "sha256sum -c --quiet /root/sums && echo intact"); r.Stdout != "intact\n" {
			t.Fatalf("a write in %s is visible in %s: %+v", a, other, r)
		}
	}
	if mid(a) == mid(b) || mid(a) == mid("restored") {
		t.Fatal("forks share a machine-id")
	}
	out, _, code = s.CLI("", "fork", "restored", "--json")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "[") || !strings.Contains(out, `"state": "running"`) {
		t.Fatalf("fork --json: %q", out)
	}

	// a paused VM can be snapshotted and then still suspended (QEMU refuses a second
	// migration from the state a first one leaves behind unless it is resumed)
	if _, err := s.Client.PauseVM(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.Snapshot(ctx, b, "paused-snap"); err != nil {
		t.Fatalf("snapshot of a paused VM: %v", err)
	}
	if v, err := s.Client.SuspendVM(ctx, b); err != nil || v.State != "suspended" {
		t.Fatalf("suspend after a snapshot of a paused VM: %v", err)
	}
	verifyState(t, s, ctx, b, before)
	s.Client.DeleteSnapshot(ctx, "paused-snap")

	// deleting the snapshot keeps what VMs still use
	if err := s.Client.DeleteSnapshot(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	verifyState(t, s, ctx, "second", last)
	if _, err := s.Client.GetSnapshot(ctx, "base"); !isStatus(err, 404) {
		t.Fatalf("deleted snapshot: %v", err)
	}
}

func TestConcurrentOperationsAndRecovery(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "busy"})
	doomed := s.CreateVM(ctx, api.CreateVMRequest{Name: "doomed"})
	if _, err := s.Client.SuspendVM(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	// An exec wakes the VM (about a second under TCG); a delete meanwhile
	// waits for the wake, then wins.
	done := make(chan error, 1)
	go func() {
		_, err := s.Client.Exec(ctx, "doomed", api.ExecRequest{Cmd: []string{"true"}})
		done <- err
	}()
	time.Sleep(150 * time.Millisecond)
	if err := s.Client.DeleteVM(ctx, "doomed"); err != nil {
		t.Fatalf("delete during a wake: %v", err)
	}
	<-done // the exec ran before the delete, or failed with the VM gone
	if _, err := s.Client.GetVM(ctx, "doomed"); !isStatus(err, 404) {
		t.Fatalf("VM deleted during a wake: %v", err)
	}
	if p := testenv.QEMUProcesses(doomed.ID); len(p) != 0 {
		t.Fatalf("QEMU of a VM deleted during its wake still runs: %v", p)
	}
	if _, err := s.Client.StartVM(ctx, "busy"); err != nil { // start of a running VM is a no-op
		t.Fatalf("start running VM: %v", err)
	}
	if _, err := s.Client.ResumeVM(ctx, "busy"); err != nil {
		t.Fatalf("resume running VM: %v", err)
	}

	// Leftovers of operations interrupted by a daemon crash are cleaned at start.
	s.Kill9()
	orphan := filepath.Join(s.DataDir, "snapshots", "snap-deadbeef0000")
	os.MkdirAll(orphan, 0o700)
	os.WriteFile(filepath.Join(orphan, "state"), []byte("half"), 0o600)
	tmp := filepath.Join(s.DataDir, "vms", v.ID, "suspend.state.tmp")
	os.WriteFile(tmp, []byte("half"), 0o600)
	s.Restart()
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphan snapshot dir survived the restart: %v", err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("half-written suspend state survived the restart: %v", err)
	}
	if r := s.Exec(ctx, "busy", "echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("after restart: %+v", r)
	}
}

func TestDeepChainIsFlattened(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "deep"})
	seedState(t, s, ctx, "deep")
	last := 1
	for i := 0; i < 6; i++ {
		s.Exec(ctx, "deep", fmt.Sprintf("echo %d > /root/gen; sync", i))
		if _, err := s.Client.Snapshot(ctx, "deep", fmt.Sprintf("gen%d", i)); err != nil {
			t.Fatalf("snapshot %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		logs, _, _ := s.CLI("", "logs", "deep")
		if strings.Contains(logs, "flattened 6 disk layers") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chain of 6 layers was not flattened:\n%s", logs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	last = verifyState(t, s, ctx, "deep", last)
	if r := s.Exec(ctx, "deep", "cat /root/gen"); r.Stdout != "5\n" {
		t.Fatalf("after flattening: %q", r.Stdout)
	}
	// every snapshot of the chain still restores
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "gen2", From: "gen2"}); err != nil {
		t.Fatal(err)
	}
	if r := s.Exec(ctx, "gen2", "cat /root/gen"); r.Stdout != "2\n" {
		t.Fatalf("snapshot gen2 after flattening: %q", r.Stdout)
	}
}

// TestForkBusyVM forks, a few times over, a VM with a hot-added vCPU whose
// memory is rewritten all the time on both vCPUs: every child must run its
// parent's kernel (same boot, no oops) with the writers alive, and the parent
// must run on. Under TCG a live precopy save lost guest writes (QEMU's TLB
// kept pages writable after the dirty bitmap forgot them), and such children
// came up with an oopsed kernel or rebooted on the panic.
func TestForkBusyVM(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "busy"})
	if r, err := s.Client.ResizeVM(ctx, "busy", api.ResizeRequest{CPUs: 2}); err != nil || r.CPUs != 2 {
		t.Fatalf("hot-add: %v %+v", err, r)
	}
	r := s.Exec(ctx, "busy", `cat > /root/dirty.py <<'END'
import sys, time
b = bytearray(int(sys.argv[1]) << 20)
v = 0
while True:
    v = (v + 1) & 255
    for off in range(0, len(b), 4096):
        b[off] = v
    time.sleep(0.2)
END
for i in 1 2; do nohup python3 /root/dirty.py 100 >/dev/null 2>&1 & done
sleep 2; pgrep -c -x python3`)
	if strings.TrimSpace(r.Stdout) != "2" {
		t.Fatalf("writers: %+v", r)
	}
	const check = "cat /proc/sys/kernel/random/boot_id /proc/sys/kernel/tainted; pgrep -c -x python3; nproc"
	want := s.Exec(ctx, "busy", check).Stdout
	if !strings.HasSuffix(want, "\n0\n2\n2\n") {
		t.Fatalf("parent before the forks: %q", want)
	}
	for round := 1; round <= 3; round++ {
		res, err := s.Client.Fork(ctx, "busy", 2)
		if err != nil {
			t.Fatalf("fork %d: %v", round, err)
		}
		t.Logf("fork %d: parent paused %d ms, %d MiB of state, %d ms", round, res.ParentPauseMs, res.StateBytes>>20, res.TookMs)
		for _, ch := range res.Children {
			if got := s.Exec(ctx, ch.Name, check).Stdout; got != want {
				log, _ := os.ReadFile(filepath.Join(s.DataDir, "vms", ch.ID, "vm.log"))
				t.Fatalf("fork %d: child %s is not a live copy of its parent: got %q, want %q\n%s", round, ch.Name, got, want, log)
			}
			if err := s.Client.DeleteVM(ctx, ch.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.Exec(ctx, "busy", check).Stdout; got != want {
		t.Fatalf("parent after the forks: %q, want %q", got, want)
	}
}
