package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// TestKSM drives page merging on and off (serve --ksm, docs/operations.md):
// the VMs of a server with --ksm get pages merged by the host's KSM, and a
// VM of a server without it never does, even with KSM running host-wide.
// KSM is host-wide: the test puts back the run mode it found (a test binary
// killed by its -timeout leaves it on: `echo 0 > /sys/kernel/mm/ksm/run`).
// Other tests' VMs run beside it unaffected: they start with mem-merge=off.
func TestKSM(t *testing.T) {
	t.Parallel()
	const run = "/sys/kernel/mm/ksm/run"
	before, err := os.ReadFile(run)
	if err != nil {
		t.Skip("this kernel has no KSM:", err)
	}
	if err := os.WriteFile(run, before, 0); err != nil {
		t.Skip("KSM cannot be changed here (a container's read-only sysfs?):", err)
	}
	if _, err := os.Stat("/proc/self/ksm_merging_pages"); err != nil {
		t.Skip("this kernel does not count merged pages per process (before 5.19):", err)
	}
	t.Cleanup(func() { os.WriteFile(run, before, 0) })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	off := testenv.Start(t, "")
	o := off.CreateVM(ctx, api.CreateVMRequest{Name: "unmerged"})
	on := testenv.Start(t, "", "--ksm")
	if b, _ := os.ReadFile(run); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("serve --ksm left KSM at %q", b)
	}
	a := on.CreateVM(ctx, api.CreateVMRequest{Name: "merged-a"})
	b := on.CreateVM(ctx, api.CreateVMRequest{Name: "merged-b"})

	onQEMUs, offQEMUs := dataDirQEMUs(on.DataDir), dataDirQEMUs(off.DataDir)
	qa, qb, qo := qemuPID(onQEMUs, a.ID), qemuPID(onQEMUs, b.ID), qemuPID(offQEMUs, o.ID)
	cmdline := func(pid int) string {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		return string(b)
	}
	if !strings.Contains(cmdline(qa), "mem-merge=on") || !strings.Contains(cmdline(qo), "mem-merge=off") {
		t.Fatalf("mem-merge: with --ksm %q, without %q", cmdline(qa), cmdline(qo))
	}
	number := func(path string) int { // a kernel counter file; 0 if unreadable
		b, _ := os.ReadFile(path)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	merging := func(pid int) int { return number("/proc/" + strconv.Itoa(pid) + "/ksm_merging_pages") }
	scans := func() int { return number("/sys/kernel/mm/ksm/full_scans") }
	start := scans()
	waitUntil(t, "KSM merges the --ksm server's VMs and scans everything twice", 10*time.Minute, func() (bool, string) {
		n := merging(qa) + merging(qb)
		return n > 0 && scans() >= start+2, "merging pages " + strconv.Itoa(n) + ", full scans " + strconv.Itoa(scans()-start)
	})
	if n := merging(qo); n != 0 {
		t.Fatalf("the VM of the server without --ksm has %d merged pages", n)
	}
	code, body := rawRequest(t, on, "GET", "/metrics", on.Token, "")
	if code != 200 || !strings.Contains(body, "agentvm_ksm_saved_bytes ") {
		t.Fatalf("metrics: %d %s", code, body)
	}
	code, body = rawRequest(t, off, "GET", "/metrics", off.Token, "")
	if code != 200 || strings.Contains(body, "agentvm_ksm_saved_bytes") {
		t.Fatalf("metrics without --ksm: %d", code)
	}
}
