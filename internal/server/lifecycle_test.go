package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/hypervisor/fakehv"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
	"github.com/agentvm/agentvm/pkg/client"
)

// Every lifecycle operation through the HTTP API and the Go client, on a
// VM service whose machines are fakes that run the real guest agent
// (internal/hypervisor/fakehv): the statuses, bodies and error codes a
// client sees, without QEMU.
func TestLifecycleOverHTTP(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the in-process guest agent runs commands as the VM's users: needs root")
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img for the disk overlays")
	}
	dir := t.TempDir()
	run, err := os.MkdirTemp("", "avm-srv-") // unix socket paths must stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	st, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	img, err := fakehv.Image(filepath.Join(dir, "image"))
	if err != nil {
		t.Fatal(err)
	}
	hv := fakehv.New()
	svc, err := vm.New(vm.Config{DataDir: filepath.Join(dir, "data"), RunDir: run, CacheDir: filepath.Join(dir, "cache"),
		QEMUVersion: "10.0.2", Accel: "tcg", Hypervisor: vm.HypervisorOf(hv), EnsureImage: fakehv.EnsureImage(img),
		Log: slog.New(slog.DiscardHandler)}, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		for _, pid := range hv.PIDs() {
			hv.Kill(pid)
		}
	})
	s := &Server{svc: svc, store: st, token: testAdmin, tokens: auth.New(st, testAdmin), log: slog.New(slog.DiscardHandler)}
	hs := httptest.NewServer(s.routes())
	t.Cleanup(hs.Close)
	c := client.New(hs.URL, testAdmin)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	code := func(err error) string {
		var ae *client.APIError
		if errors.As(err, &ae) {
			return ae.Code
		}
		return ""
	}
	state := func(want api.State) {
		t.Helper()
		v, err := c.GetVM(ctx, "box")
		if err != nil || v.State != want {
			t.Fatalf("box: %v, state %v, want %s", err, v, want)
		}
	}
	echo := func(name, word string) {
		t.Helper()
		res, err := c.Exec(ctx, name, api.ExecRequest{Cmd: []string{"echo", word}})
		if err != nil || res.ExitCode != 0 || res.Stdout != word+"\n" {
			t.Fatalf("exec in %s: %+v %v", name, res, err)
		}
	}

	v, err := c.CreateVM(ctx, api.CreateVMRequest{Name: "box", Memory: 512 << 20})
	if err != nil || v.State != api.StateRunning {
		t.Fatalf("create: %+v %v", v, err)
	}
	echo("box", "hello")
	if _, err := c.CreateVM(ctx, api.CreateVMRequest{Name: "box", Memory: 512 << 20}); code(err) != "conflict" {
		t.Fatalf("a second VM named box: %v", err)
	}
	if _, err := c.PauseVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	state(api.StatePaused)
	echo("box", "woken") // an exec resumes a paused VM
	state(api.StateRunning)
	if _, err := c.SuspendVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	state(api.StateSuspended)
	if _, err := c.WakeVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	state(api.StateRunning)
	sn, err := c.Snapshot(ctx, "box", "snap")
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.CreateVM(ctx, api.CreateVMRequest{Name: "copy", From: sn.Name})
	if err != nil || from.State != api.StateRunning {
		t.Fatalf("create --from: %+v %v", from, err)
	}
	echo("copy", "copied")
	fr, err := c.Fork(ctx, "box", 2)
	if err != nil || len(fr.Children) != 2 || fr.Parent.State != api.StateRunning {
		t.Fatalf("fork: %+v %v", fr, err)
	}
	for _, ch := range fr.Children {
		echo(ch.Name, "child")
	}
	if r, err := c.ResizeVM(ctx, "box", api.ResizeRequest{CPUs: 2}); err != nil || r.CPUs != 2 {
		t.Fatalf("resize: %+v %v", r, err)
	}
	if _, err := c.ResizeVM(ctx, "box", api.ResizeRequest{Disk: 1 << 20}); code(err) != "invalid_argument" {
		t.Fatalf("shrinking the disk: %v", err)
	}
	if _, err := c.StopVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	state(api.StateStopped)
	if _, err := c.Exec(ctx, "box", api.ExecRequest{Cmd: []string{"true"}}); code(err) != "conflict" {
		t.Fatalf("exec in a stopped VM: %v", err)
	}
	if _, err := c.StartVM(ctx, "box"); err != nil {
		t.Fatal(err)
	}
	echo("box", "again")
	hv.MachineOf(v.ID).Crash()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := c.GetVM(ctx, "box")
		if err == nil && got.State == api.StateCrashed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a crash: %+v %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, name := range []string{"box", "copy", fr.Children[0].Name, fr.Children[1].Name} {
		if err := c.DeleteVM(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	if _, err := c.GetVM(ctx, "box"); code(err) != "not_found" {
		t.Fatalf("get after delete: %v", err)
	}
	if n := hv.Running(); n != 0 {
		t.Fatalf("%d machines still run", n)
	}
}
