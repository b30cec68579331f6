package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestArgs(t *testing.T) {
	c := Config{ID: "vm-1", Accel: "tcg", CPUModel: "max", CPUs: 2, MemoryMiB: 512, Kernel: "k", Initrd: "i", Append: "a",
		Disk: "/d.qcow2", RAMPath: "/ram", QMPSock: "/q", AgentSock: "/a", NetSock: "/n", LogPath: "/l", MAC: "m", VMGenID: "g", Incoming: "/state"}
	got := strings.Join(c.Args(), " ")
	for _, want := range []string{"-name guest=vm-1,", "pc-q35-7.2,memory-backend=mem,mem-merge=off", "mem-path=/ram,share=off", "-incoming defer",
		"-smp 2", "-accel tcg", "server=on,addr.type=unix,addr.path=/n", "name=agentvm.0", "vmgenid,guid=g"} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
	c.RAMPath, c.Incoming = "", ""
	got = strings.Join(c.Args(), " ")
	if !strings.Contains(got, "memory-backend-ram,id=mem,size=512M") || strings.Contains(got, "-incoming") {
		t.Errorf("cold boot args: %s", got)
	}
	c.MemMerge = true // serve --ksm
	if got = strings.Join(c.Args(), " "); !strings.Contains(got, "memory-backend=mem,mem-merge=on") {
		t.Errorf("mem-merge args: %s", got)
	}
}

func TestResolveAccel(t *testing.T) {
	for _, f := range []string{"kvm", "tcg"} {
		if a, _, err := ResolveAccel(f); err != nil || a != f {
			t.Errorf("%s: %s %v", f, a, err)
		}
	}
	if _, _, err := ResolveAccel("xen"); err == nil {
		t.Error("xen accepted")
	}
	if a, why, err := ResolveAccel("auto"); err != nil || (a != "kvm" && a != "tcg") || why == "" {
		t.Errorf("auto: %s %s %v", a, why, err)
	}
}

// qmpCall is one command a fake QMP server received.
type qmpCall struct {
	Execute   string         `json:"execute"`
	ID        string         `json:"id"`
	Arguments map[string]any `json:"arguments"`
}

// serveFakeQMP listens on path and speaks QMP's framing: the greeting, then
// for each command the lines answer returns (a reply must carry the call's
// id), closing the connection after them when answer says so.
func serveFakeQMP(t *testing.T, path string, answer func(m qmpCall) (lines []string, hangUp bool)) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var m qmpCall
			json.Unmarshal(line, &m)
			lines, hangUp := answer(m)
			for _, l := range lines {
				c.Write([]byte(l + "\n"))
			}
			if hangUp {
				return
			}
		}
	}()
}

// qmpReturn is a reply line carrying v (JSON) for call m; qmpError an error reply.
func qmpReturn(m qmpCall, v string) string { return `{"return": ` + v + `, "id": "` + m.ID + `"}` }

func qmpError(m qmpCall, class, desc string) string {
	return `{"error": {"class": "` + class + `", "desc": "` + desc + `"}, "id": "` + m.ID + `"}`
}

// fakeQEMU speaks enough QMP for the client: replies by id, errors and events.
func fakeQEMU(t *testing.T, path string) {
	serveFakeQMP(t, path, func(m qmpCall) ([]string, bool) {
		switch m.Execute {
		case "query-status":
			return []string{`{"event": "STOP", "data": {}}`, qmpReturn(m, `{"status": "running"}`)}, false
		case "bad":
			return []string{qmpError(m, "GenericError", "nope")}, false
		case "quit": // no reply: the connection closes
			return []string{`{"event": "SHUTDOWN", "data": {"guest": false, "reason": "host-qmp-quit"}}`}, true
		}
		return []string{qmpReturn(m, `{}`)}, false
	})
}

func TestQMP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	fakeQEMU(t, sock)
	events := make(chan string, 10)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := DialQMP(ctx, sock, func(e Event) { events <- e.Event })
	if err != nil {
		t.Fatal(err)
	}
	r, err := q.Execute(ctx, "query-status", nil)
	if err != nil || !strings.Contains(string(r), "running") {
		t.Fatalf("query-status: %s %v", r, err)
	}
	if e := <-events; e != "STOP" {
		t.Fatalf("event %s", e)
	}
	if _, err := q.Execute(ctx, "bad", nil); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("error reply: %v", err)
	}
	q.Execute(ctx, "quit", nil) // connection closes without a reply
	select {
	case <-q.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed")
	}
	if _, err := q.Execute(ctx, "query-status", nil); err == nil {
		t.Fatal("execute after close succeeded")
	}
}

func TestAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{{"7.2.22", false}, {"8.2.0", false}, {"9.0.0", true}, {"10.0.3", true}, {"garbage", false}} {
		if got := atLeast(c.v, 9, 0); got != c.want {
			t.Errorf("atLeast(%q, 9, 0) = %v", c.v, got)
		}
	}
	if precopyUnreliable("kvm", "7.2.22") {
		t.Error("KVM precopy counted as unreliable")
	}
	if !precopyUnreliable("tcg", "7.2.22") || precopyUnreliable("tcg", "9.0.0") {
		t.Error("TCG precopy judged wrongly by version")
	}
}

func TestSetOOMScoreAdj(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := SetOOMScoreAdj(cmd.Process.Pid, 1000); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/oom_score_adj")
	if err != nil || strings.TrimSpace(string(b)) != "1000" {
		t.Fatalf("oom_score_adj %q %v", b, err)
	}
	if err := SetOOMScoreAdj(1<<30, 0); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
