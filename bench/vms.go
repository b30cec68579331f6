package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

const (
	vmMemory = 512 << 20
	vmDisk   = 8 << 30 // the image size: no resize during create
)

var vmShape = api.CreateVMRequest{Memory: vmMemory, Disk: vmDisk}

type bench struct {
	o   options
	srv *server
	c   *client.Client
	r   *Report
	tmp string

	mu    sync.Mutex
	vms   map[string]int // VMs this run created -> QEMU pid (0 if unknown)
	snaps []string       // snapshots this run created and has not deleted yet

	sshCleanup func() // closes the ControlMaster and the forwarder, if started
}

func (b *bench) track(id string, pid int) {
	b.mu.Lock()
	b.vms[id] = pid
	b.mu.Unlock()
}

func (b *bench) untrack(id string) {
	b.mu.Lock()
	delete(b.vms, id)
	b.mu.Unlock()
}

// create makes one VM of the benchmark shape and tracks it for cleanup.
func (b *bench) create(ctx context.Context) (string, error) {
	v, err := b.c.CreateVM(ctx, vmShape)
	if err != nil {
		return "", err
	}
	b.track(v.ID, v.PID)
	return v.ID, nil
}

// remove deletes a VM (not timed) and stops tracking it once the server confirms.
func (b *bench) remove(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.c.DeleteVM(ctx, id); err != nil && !client.IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	b.untrack(id)
	return nil
}

// cleanup runs on every exit path: ssh master and forwarder first, then every VM
// this run created (and any other VM on this private server) is deleted through
// the API. If the API cannot delete one, its QEMU process (a pid the server
// reported for a VM we created) is killed after checking its command line.
func (b *bench) cleanup() {
	if b.sshCleanup != nil {
		b.sshCleanup()
		b.sshCleanup = nil
	}
	if b.o.lifecycle {
		b.deleteSnapshots()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if vms, err := b.c.ListVMs(ctx); err == nil {
		for _, v := range vms {
			b.mu.Lock()
			if _, ok := b.vms[v.ID]; !ok || v.PID > 0 {
				b.vms[v.ID] = v.PID
			}
			b.mu.Unlock()
		}
	}
	b.mu.Lock()
	ids := make(map[string]int, len(b.vms))
	for id, pid := range b.vms {
		ids[id] = pid
	}
	b.mu.Unlock()
	for id, pid := range ids {
		logf("deleting %s", id)
		if err := b.remove(id); err != nil {
			logf("cleanup: %v", err)
			if pid > 0 && qemuOf(pid, id) {
				logf("cleanup: killing QEMU pid %d of %s", pid, id)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// qemuOf reports whether pid is still the QEMU process of VM id.
func qemuOf(pid int, id string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte("guest="+id+","))
}

// firstExec runs `true` until it succeeds (an error right after a create is
// retried for up to a minute) and returns how many attempts failed.
func (b *bench) firstExec(ctx context.Context, id string) (int, error) {
	deadline := time.Now().Add(time.Minute)
	for failed := 0; ; failed++ {
		res, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && res.ExitCode == 0 {
			return failed, nil
		}
		if err == nil {
			err = fmt.Errorf("true exited %d (stderr %q)", res.ExitCode, res.Stderr)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return failed, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createToExec creates a VM (tracked for cleanup) and waits for its first
// exec of `true`: the VM, the create call's time, the time from the create
// to the exec's answer and the failed exec attempts.
func (b *bench) createToExec(ctx context.Context, req api.CreateVMRequest) (v *api.VM, created, toExec time.Duration, retries int, err error) {
	t0 := time.Now()
	v, err = b.c.CreateVM(ctx, req)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	created = time.Since(t0)
	b.track(v.ID, v.PID)
	retries, err = b.firstExec(ctx, v.ID)
	toExec = time.Since(t0)
	if err != nil {
		return v, created, toExec, retries, fmt.Errorf("first exec in %s: %w", v.ID, err)
	}
	return v, created, toExec, retries, nil
}

// coldBoot is the first create against the server: with a fresh template dir it
// cold-boots the template (the image is already cached).
func (b *bench) coldBoot(ctx context.Context) error {
	cb := &b.r.ColdBoot
	cb.Measured = !b.o.keepTemplate
	logf("first create (%s)", map[bool]string{true: "cold-boots the template", false: "cached template"}[cb.Measured])
	t0 := time.Now()
	v, created, toExec, retries, err := b.createToExec(ctx, vmShape)
	if err != nil {
		return err
	}
	cb.FirstCreateWallMs = ms(created)
	cb.FirstCreateToFirstExecMs = ms(toExec)
	cb.FirstExecRetries = retries
	got, err := b.c.GetVM(ctx, v.ID)
	if err != nil {
		return err
	}
	cb.FirstCreateServerMs = got.CreateMs
	cb.TemplateKey = got.Template
	cb.TemplateJSON = filepath.Join(b.srv.templateDir, got.Template, "template.json")
	if raw, err := os.ReadFile(cb.TemplateJSON); err != nil {
		b.r.Errors = append(b.r.Errors, "read template.json: "+err.Error())
	} else {
		var t struct {
			ColdBootMs int64     `json:"cold_boot_ms"`
			CreatedAt  time.Time `json:"created_at"`
			QEMU       string    `json:"qemu_version"`
			Accel      string    `json:"accel"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			b.r.Errors = append(b.r.Errors, "parse template.json: "+err.Error())
		}
		cb.TemplateColdBootMs = t.ColdBootMs
		cb.TemplateCreatedAt = t.CreatedAt
		cb.TemplateAccel = t.Accel
		if !cb.Measured && t.CreatedAt.After(t0) {
			// -keep-template, but the cache had no template of this shape: this
			// create did cold-boot it after all.
			cb.Measured = true
			b.r.Notes = append(b.r.Notes, "-keep-template was given but no cached template of this shape existed; the first create cold-booted it.")
		}
	}
	logf("first create: wall %d ms, server create_ms %d, template cold_boot_ms %d, to first exec %d ms",
		cb.FirstCreateWallMs, cb.FirstCreateServerMs, cb.TemplateColdBootMs, cb.FirstCreateToFirstExecMs)
	return b.remove(v.ID)
}

// createLoop measures N sequential creates from the (now warm) template, each
// followed by its first exec of `true`; each VM is deleted (untimed) before the next.
func (b *bench) createLoop(ctx context.Context) error {
	var total, createOnly, server []float64
	for i := 0; i < b.o.creates; i++ {
		t0 := time.Now()
		v, err := b.c.CreateVM(ctx, vmShape)
		if err != nil {
			return fmt.Errorf("create %d: %w", i+1, err)
		}
		created := time.Since(t0)
		b.track(v.ID, v.PID)
		retries, err := b.firstExec(ctx, v.ID)
		toExec := time.Since(t0)
		if err != nil {
			return fmt.Errorf("first exec in %s: %w", v.ID, err)
		}
		b.r.CreateRetries += retries
		total = append(total, msf(toExec))
		createOnly = append(createOnly, msf(created))
		server = append(server, float64(v.CreateMs))
		if b.o.verbose || i == 0 || (i+1)%5 == 0 {
			logf("create %d/%d: create %.0f ms (server %d ms), to first exec %.0f ms", i+1, b.o.creates,
				msf(created), v.CreateMs, msf(toExec))
		}
		if err := b.remove(v.ID); err != nil {
			return err
		}
	}
	b.r.CreateToFirstExec = summarize(total)
	b.r.CreateOnly = summarize(createOnly)
	b.r.CreateServer = summarize(server)
	return nil
}

// execBench measures `true` round trips on one VM through the SDK (buffered and
// upgraded streaming, interleaved so both see the same VM and host conditions)
// and through the CLI binary.
func (b *bench) execBench(ctx context.Context, id string) error {
	req := api.ExecRequest{Cmd: []string{"true"}}
	var guestMs []float64
	sdkExec := func() error {
		res, err := b.c.Exec(ctx, id, req)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		if err == nil {
			guestMs = append(guestMs, float64(res.DurationMs))
		}
		return err
	}
	sdkRun := func() error {
		st, err := b.c.Run(ctx, id, req, nil, io.Discard, io.Discard)
		if err == nil && st.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", st.ExitCode)
		}
		if err == nil {
			guestMs = append(guestMs, float64(st.DurationMs))
		}
		return err
	}
	cliBin := filepath.Join(b.srv.bin, "agentvm")
	env := b.srv.cliEnv()
	cli := func() error {
		cmd := exec.CommandContext(ctx, cliBin, "exec", id, "--", "true")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("agentvm exec: %v: %s", err, bytes.TrimSpace(out))
		}
		return nil
	}
	for i := 0; i < 5; i++ {
		if err := sdkExec(); err != nil {
			return fmt.Errorf("SDK client.Exec (warm-up): %w", err)
		}
		if err := sdkRun(); err != nil {
			return fmt.Errorf("SDK client.Run (warm-up): %w", err)
		}
	}
	guestMs = guestMs[:0]
	var dExec, dRun []float64
	timed := func(f func() error, into *[]float64) error {
		t0 := time.Now()
		if err := f(); err != nil {
			return err
		}
		*into = append(*into, msf(time.Since(t0)))
		return nil
	}
	for i := 0; i < b.o.execs; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		first, second := func() error { return timed(sdkExec, &dExec) }, func() error { return timed(sdkRun, &dRun) }
		if i%2 == 1 {
			first, second = second, first
		}
		if err := first(); err != nil {
			return fmt.Errorf("SDK exec call %d: %w", i+1, err)
		}
		if err := second(); err != nil {
			return fmt.Errorf("SDK exec call %d: %w", i+1, err)
		}
	}
	b.r.Exec.SDKExec, b.r.Exec.SDKRun = summarize(dExec), summarize(dRun)
	b.r.Exec.Guest = summarize(guestMs)
	b.r.Exec.Guest.Raw = nil
	for _, x := range []struct {
		name string
		s    Stats
	}{{"SDK client.Exec", b.r.Exec.SDKExec}, {"SDK client.Run", b.r.Exec.SDKRun}, {"guest-side duration", b.r.Exec.Guest}} {
		logf("%-22s n=%d p50 %.1f ms p90 %.1f ms", x.name, x.s.N, x.s.P50, x.s.P90)
	}
	var err error
	if b.r.Exec.CLI, err = timeLoop(ctx, "CLI agentvm exec", 3, b.o.cliExecs, cli); err != nil {
		return err
	}
	return nil
}

// timeLoop runs f warm times untimed, then n timed times.
func timeLoop(ctx context.Context, name string, warm, n int, f func() error) (Stats, error) {
	for i := 0; i < warm; i++ {
		if err := f(); err != nil {
			return Stats{}, fmt.Errorf("%s (warm-up): %w", name, err)
		}
	}
	d := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return Stats{}, ctx.Err()
		}
		t0 := time.Now()
		if err := f(); err != nil {
			return Stats{}, fmt.Errorf("%s (call %d): %w", name, i+1, err)
		}
		d = append(d, msf(time.Since(t0)))
	}
	s := summarize(d)
	logf("%-22s n=%d p50 %.1f ms p90 %.1f ms", name, s.N, s.P50, s.P90)
	return s, nil
}

func ms(d time.Duration) int64    { return d.Milliseconds() }
func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
