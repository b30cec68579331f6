package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
)

// fakeSystemd imitates systemctl, systemd-run and journalctl closely enough
// for the agent: it records the commands and keeps unit properties that
// systemctl show reports.
type fakeSystemd struct {
	t    *testing.T
	root string

	mu      sync.Mutex
	calls   []string   // "systemctl start agentvm-x.service"
	argvs   [][]string // the same, split
	units   map[string]map[string]string
	fail    map[string]error // "systemctl enable" -> error
	mainPID int              // MainPID of started units
	stream  func(ctx context.Context, w io.Writer, name string, args ...string) error
}

func newFakeSystemd(t *testing.T) *fakeSystemd {
	return &fakeSystemd{t: t, units: map[string]map[string]string{}, fail: map[string]error{}, mainPID: 4321}
}

func (f *fakeSystemd) systemd() *systemd {
	return &systemd{
		run: f.run,
		stream: func(ctx context.Context, w io.Writer, name string, args ...string) error {
			f.record(name, args)
			f.mu.Lock()
			fn := f.stream
			f.mu.Unlock()
			if fn == nil {
				return errors.New("no stream")
			}
			return fn(ctx, w, name, args...)
		},
	}
}

func (f *fakeSystemd) record(name string, args []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.Join(append([]string{name}, args...), " "))
	f.argvs = append(f.argvs, append([]string{name}, args...))
}

// takeCalls returns the calls recorded so far (except show) and forgets them.
func (f *fakeSystemd) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if !strings.HasPrefix(c, "systemctl show ") {
			out = append(out, c)
		}
	}
	f.calls, f.argvs = nil, nil
	return out
}

// shows counts the systemctl show calls recorded.
func (f *fakeSystemd) shows() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, "systemctl show ") {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeSystemd) set(unit string, kv ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.unitLocked(unit)
	for i := 0; i+1 < len(kv); i += 2 {
		p[kv[i]] = kv[i+1]
	}
}

func (f *fakeSystemd) unitLocked(unit string) map[string]string {
	p := f.units[unit]
	if p == nil {
		p = map[string]string{"LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0",
			"ExecMainStatus": "0", "ExecMainCode": "0", "NRestarts": "0", "UnitFileState": "disabled"}
		f.units[unit] = p
	}
	return p
}

func (f *fakeSystemd) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.record(name, args)
	f.mu.Lock()
	defer f.mu.Unlock()
	verb := name
	if len(args) > 0 {
		verb += " " + args[0]
	}
	if err := f.fail[verb]; err != nil {
		return nil, err
	}
	if err := f.fail[name]; err != nil {
		return nil, err
	}
	unitArg := ""
	if len(args) > 1 {
		unitArg = args[len(args)-1]
	}
	if name == "systemd-run" {
		verb = name
	}
	switch verb {
	case "systemctl show":
		// systemctl show U1 U2 -p P --timestamp=unix
		var units []string
		props := ""
		for i := 1; i < len(args); i++ {
			switch {
			case args[i] == "-p":
				i++
				props = args[i]
			case strings.HasPrefix(args[i], "--"):
				if args[i] != "--timestamp=unix" {
					f.t.Errorf("show: unexpected %s", args[i])
				}
			default:
				units = append(units, args[i])
			}
		}
		var b strings.Builder
		for i, u := range units {
			if i > 0 {
				b.WriteString("\n")
			}
			p, ok := f.units[u]
			for _, k := range strings.Split(props, ",") {
				v := p[k]
				if !ok {
					v = map[string]string{"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}[k]
				}
				fmt.Fprintf(&b, "%s=%s\n", k, v)
			}
		}
		return []byte(b.String()), nil
	case "systemctl daemon-reload":
		ents, _ := os.ReadDir(filepath.Join(f.root, svcUnitDir))
		present := map[string]bool{}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "agentvm-") && strings.HasSuffix(e.Name(), ".service") {
				present[e.Name()] = true
				f.unitLocked(e.Name())
			}
		}
		for u := range f.units {
			if !strings.HasPrefix(u, jobUnitPfx) && !present[u] && f.units[u]["ActiveState"] != "active" {
				delete(f.units, u)
			}
		}
	case "systemctl enable":
		f.unitLocked(unitArg)["UnitFileState"] = "enabled"
	case "systemctl disable":
		if p, ok := f.units[unitArg]; ok {
			p["UnitFileState"] = "disabled"
		}
	case "systemctl start", "systemctl restart":
		p := f.unitLocked(unitArg)
		p["ActiveState"], p["SubState"], p["MainPID"] = "active", "running", strconv.Itoa(f.mainPID)
		p["ActiveEnterTimestamp"], p["ExecMainStartTimestamp"] = "@1700000000", "@1700000000"
	case "systemctl stop":
		p, ok := f.units[unitArg]
		if !ok {
			return nil, errors.New("Failed to stop " + unitArg + ": Unit " + unitArg + " not loaded.")
		}
		p["ActiveState"], p["SubState"], p["MainPID"] = "inactive", "dead", "0"
		if strings.HasPrefix(unitArg, jobUnitPfx) {
			delete(f.units, unitArg) // collected
		}
	case "systemd-run":
		for _, a := range args {
			if u, ok := strings.CutPrefix(a, "--unit="); ok {
				p := f.unitLocked(u + ".service")
				p["ActiveState"], p["SubState"], p["MainPID"] = "active", "running", strconv.Itoa(f.mainPID)
			}
		}
	}
	return nil, nil
}

// startSvcAgent starts an agent whose systemd is a fake, with the test user.
func startSvcAgent(t *testing.T) (*env, *fakeSystemd, string) {
	t.Helper()
	fake := newFakeSystemd(t)
	old := systemdFor
	systemdFor = func(*Agent) *systemd { return fake.systemd() }
	defer func() { systemdFor = old }()
	e, home := startFilesAgent(t)
	fake.root = e.root
	return e, fake, home
}

func TestUnitQuote(t *testing.T) {
	for _, tc := range []struct {
		in, cmd, env string
		bad          bool
	}{
		{in: "plain", cmd: `"plain"`, env: `"plain"`},
		{in: "a b", cmd: `"a b"`, env: `"a b"`},
		{in: `q"uote`, cmd: `"q\"uote"`, env: `"q\"uote"`},
		{in: "$HOME ${X} $$", cmd: `"$$HOME $${X} $$$$"`, env: `"$HOME ${X} $$"`},
		{in: "100%", cmd: `"100%%"`, env: `"100%%"`},
		{in: `back\slash\`, cmd: `"back\\slash\\"`, env: `"back\\slash\\"`},
		{in: "tab\there", cmd: `"tab\there"`, env: `"tab\there"`},
		{in: "'single' ;", cmd: `"'single' ;"`, env: `"'single' ;"`},
		{in: "", cmd: `""`, env: `""`},
		{in: "ünï€ode", cmd: `"ünï€ode"`, env: `"ünï€ode"`},
		{in: "new\nline", bad: true},
		{in: "cr\r", bad: true},
		{in: "nul\x00", bad: true},
		{in: "del\x7f", bad: true},
		{in: "bad\xffutf8", bad: true},
	} {
		cmd, err1 := unitQuote(tc.in, true)
		env, err2 := unitQuote(tc.in, false)
		if tc.bad {
			if err1 == nil || err2 == nil {
				t.Errorf("unitQuote(%q) = %q, %q; want errors", tc.in, cmd, env)
			}
			continue
		}
		if err1 != nil || err2 != nil || cmd != tc.cmd || env != tc.env {
			t.Errorf("unitQuote(%q) = %q %v, %q %v; want %q, %q", tc.in, cmd, err1, env, err2, tc.cmd, tc.env)
		}
	}
	if s, err := unitPlain("/srv/my app/100%"); err != nil || s != "/srv/my app/100%%" {
		t.Errorf("unitPlain = %q, %v", s, err)
	}
	for _, bad := range []string{"/srv/x ", " /srv", "/a\nb", "/a\tb"} {
		if _, err := unitPlain(bad); err == nil {
			t.Errorf("unitPlain(%q) accepted", bad)
		}
	}
}

func TestParseShow(t *testing.T) {
	out := "ActiveState=active\nSubState=running\nMainPID=42\nActiveEnterTimestamp=@1700000000\nExecMainStartTimestamp=\nDescription=a=b\n\nActiveState=failed\nSubState=failed\nMainPID=0\n"
	b := parseShow([]byte(out))
	if len(b) != 2 || b[0]["MainPID"] != "42" || b[0]["Description"] != "a=b" || b[1]["ActiveState"] != "failed" || b[0]["ExecMainStartTimestamp"] != "" {
		t.Fatalf("parseShow = %v", b)
	}
	if got := showTime(b[0]["ActiveEnterTimestamp"]); !got.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("showTime = %v", got)
	}
	if got := showTime("@1700000000.250000"); !got.Equal(time.Unix(1700000000, 250000000)) {
		t.Errorf("showTime frac = %v", got)
	}
	for _, z := range []string{"", "n/a", "@0"} {
		if got := showTime(z); !got.IsZero() {
			t.Errorf("showTime(%q) = %v", z, got)
		}
	}
	if len(parseShow(nil)) != 0 || len(parseShow([]byte("\n\n"))) != 0 {
		t.Error("empty output gave blocks")
	}
	si := serviceInfo(&svcMeta{Name: "x", Argv: []string{"a"}, User: "root", Restart: "always", Type: "simple"}, map[string]string{
		"ActiveState": "active", "SubState": "running", "MainPID": "42", "ExecMainStatus": "0", "NRestarts": "3",
		"UnitFileState": "enabled", "ActiveEnterTimestamp": "@1700000100", "ExecMainStartTimestamp": "@1700000000",
	})
	if si.Unit != "agentvm-x.service" || !si.Enabled || si.MainPID != 42 || si.Restarts != 3 || !si.Since.Equal(time.Unix(1700000100, 0)) {
		t.Errorf("serviceInfo = %+v", si)
	}
	si = serviceInfo(&svcMeta{Name: "x"}, map[string]string{
		"ActiveState": "failed", "SubState": "failed", "ExecMainStatus": "3", "UnitFileState": "disabled",
		"ActiveEnterTimestamp": "@1700000100", "ExecMainStartTimestamp": "@1700000200",
	})
	if si.Enabled || si.ExitCode != 3 || !si.Since.Equal(time.Unix(1700000200, 0)) || si.Argv == nil {
		t.Errorf("serviceInfo failed = %+v", si)
	}
}

func wantCalls(t *testing.T, f *fakeSystemd, want ...string) {
	t.Helper()
	got := f.takeCalls()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("commands:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestServices(t *testing.T) {
	e, fake, home := startSvcAgent(t)
	ctx := context.Background()
	c := e.c
	printf, err := lookPath("printf", userPath, home)
	if err != nil {
		t.Fatal(err)
	}
	tricky := []string{"printf", "a b", `q"uote`, "$HOME", "100%", `back\slash`, "tab\there", "'single'", ";", ""}
	unitPath := filepath.Join(e.root, "etc/systemd/system/agentvm-web.service")

	t.Run("create", func(t *testing.T) {
		si, err := c.CreateService(ctx, api.ServiceCreate{
			Name: "web", Argv: tricky, User: testUser, Cwd: home,
			Env: map[string]string{"GREETING": `hi "there" $USER 50%`, "B": "2"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if si.Name != "web" || si.Unit != "agentvm-web.service" || strings.Join(si.Argv, "|") != strings.Join(tricky, "|") ||
			si.User != testUser || si.Restart != "on-failure" || si.Type != "simple" || !si.Enabled ||
			si.ActiveState != "active" || si.SubState != "running" || si.MainPID != 4321 || !si.Since.Equal(time.Unix(1700000000, 0)) {
			t.Fatalf("info = %+v", si)
		}
		wantCalls(t, fake, "systemctl daemon-reload", "systemctl enable --no-reload agentvm-web.service", "systemctl start agentvm-web.service")
		b, err := os.ReadFile(unitPath)
		if err != nil {
			t.Fatal(err)
		}
		want := `# Created by the agentvm guest agent (/v1/services).
[Unit]
Description=agentvm service web
After=network.target

[Service]
Type=simple
ExecStart="` + printf + `" "a b" "q\"uote" "$$HOME" "100%%" "back\\slash" "tab\there" "'single'" ";" ""
User=agvtest
Group=4242
WorkingDirectory=` + home + `
Environment="B=2"
Environment="GREETING=hi \"there\" $USER 50%%"
Environment="PATH=` + userPath + `"
Restart=on-failure
RestartSec=1
StandardOutput=journal

[Install]
WantedBy=multi-user.target
`
		if string(b) != want {
			t.Fatalf("unit file:\n%s\nwant:\n%s", b, want)
		}
		fi, _ := os.Stat(unitPath)
		if fi.Mode().Perm() != 0o644 {
			t.Errorf("unit mode %v", fi.Mode())
		}
		var meta svcMeta
		mb, err := os.ReadFile(filepath.Join(e.root, "var/lib/agentvm/services/web.json"))
		if err != nil || json.Unmarshal(mb, &meta) != nil || meta.User != testUser || len(meta.Argv) != len(tricky) || meta.Type != "simple" {
			t.Fatalf("sidecar %s: %v", mb, err)
		}
		checkUnitWithSystemd(t, unitPath, map[string]string{
			"Command Line":     dumpCommand(append([]string{printf}, tricky[1:]...)),
			"Environment":      "B=2",
			"WorkingDirectory": home,
			"User":             testUser,
			"Group":            "4242",
			"Type":             "simple",
			"Restart":          "on-failure",
		}, []string{`GREETING=hi "there" $USER 50%`, "PATH=" + userPath})
	})

	t.Run("invalid", func(t *testing.T) {
		for _, tc := range []struct {
			req  api.ServiceCreate
			code int
			msg  string
		}{
			{api.ServiceCreate{Name: "web", Argv: []string{"true"}}, 409, "exists"},
			{api.ServiceCreate{Name: "Web", Argv: []string{"true"}}, 400, "invalid service name"},
			{api.ServiceCreate{Name: "", Argv: []string{"true"}}, 400, "invalid service name"},
			{api.ServiceCreate{Name: "a/b", Argv: []string{"true"}}, 400, "invalid service name"},
			{api.ServiceCreate{Name: strings.Repeat("a", 64), Argv: []string{"true"}}, 400, "invalid service name"},
			{api.ServiceCreate{Name: "guest", Argv: []string{"true"}}, 400, "reserved"},
			{api.ServiceCreate{Name: "job-x", Argv: []string{"true"}}, 400, "reserved"},
			{api.ServiceCreate{Name: "x", Argv: []string{"true"}, Restart: "sometimes"}, 400, "invalid restart"},
			{api.ServiceCreate{Name: "x", Argv: []string{"true"}, Type: "forking"}, 400, "invalid type"},
			{api.ServiceCreate{Name: "x", Argv: []string{"true"}, Type: "oneshot", Restart: "always"}, 400, "oneshot"},
			{api.ServiceCreate{Name: "x", Argv: []string{"true"}, User: "nosuchuser"}, 400, "unknown user"},
			{api.ServiceCreate{Name: "x"}, 400, "argv or shell is required"},
			{api.ServiceCreate{Name: "x", Argv: []string{"true"}, Shell: "true"}, 400, "not both"},
			{api.ServiceCreate{Name: "x", Argv: []string{"no-such-command-xyz"}}, 400, "command not found"},
			{api.ServiceCreate{Name: "x", Argv: []string{"echo", "a\nb"}}, 400, "newline"},
			{api.ServiceCreate{Name: "x", Shell: "echo a\necho b"}, 400, "newline"},
			{api.ServiceCreate{Name: "x", Argv: []string{"echo"}, Env: map[string]string{"A": "x\ny"}}, 400, "newline"},
			{api.ServiceCreate{Name: "x", Argv: []string{"echo"}, Env: map[string]string{"A-B": "x"}}, 400, "invalid env name"},
			{api.ServiceCreate{Name: "x", Argv: []string{"echo"}, Cwd: "/nonexistent-dir"}, 400, "cwd"},
		} {
			_, err := c.CreateService(ctx, tc.req)
			code := map[int]string{400: "invalid", 409: "exists"}[tc.code]
			wantAPIError(t, err, tc.code, code, tc.msg)
		}
		// A unit file of that name elsewhere (the agent's own, say).
		os.MkdirAll(filepath.Join(e.root, "lib/systemd/system"), 0o755)
		os.WriteFile(filepath.Join(e.root, "lib/systemd/system/agentvm-other.service"), []byte("[Service]\n"), 0o644)
		_, err := c.CreateService(ctx, api.ServiceCreate{Name: "other", Argv: []string{"true"}})
		wantAPIError(t, err, 409, "exists")
		wantCalls(t, fake)
		if _, err := os.Stat(filepath.Join(e.root, "etc/systemd/system/agentvm-x.service")); !os.IsNotExist(err) {
			t.Fatalf("unit file left: %v", err)
		}
	})

	t.Run("shell oneshot", func(t *testing.T) {
		si, err := c.CreateService(ctx, api.ServiceCreate{Name: "once.1", Shell: `echo "$HOME" 100% \ done`, Type: "oneshot", Restart: "no", NoBoot: true, NoStart: true,
			Env: map[string]string{"HOME": "/srv/home"}})
		if err != nil {
			t.Fatal(err)
		}
		if si.Enabled || si.ActiveState != "inactive" || si.Type != "oneshot" || si.Restart != "no" || si.User != "root" ||
			strings.Join(si.Argv, "|") != `/bin/sh|-c|echo "$HOME" 100% \ done` {
			t.Fatalf("info = %+v", si)
		}
		wantCalls(t, fake, "systemctl daemon-reload")
		b, _ := os.ReadFile(filepath.Join(e.root, "etc/systemd/system/agentvm-once.1.service"))
		for _, line := range []string{
			`ExecStart="/bin/sh" "-c" "echo \"$$HOME\" 100%% \\ done"`,
			"Type=oneshot\n", "Restart=no\n", "RemainAfterExit=no\n", "User=root\n", "Group=0\n", "WorkingDirectory=/root\n",
			`Environment="PATH=` + rootPath + `"`, `Environment="HOME=/srv/home"`,
		} {
			if !strings.Contains(string(b), line) {
				t.Errorf("unit file lacks %q:\n%s", line, b)
			}
		}
		checkUnitWithSystemd(t, filepath.Join(e.root, "etc/systemd/system/agentvm-once.1.service"), map[string]string{
			"Command Line": dumpCommand([]string{"/bin/sh", "-c", `echo "$HOME" 100% \ done`}),
			"Type":         "oneshot",
			"Restart":      "no",
		}, nil)
	})

	t.Run("no group", func(t *testing.T) {
		// A primary gid missing from /etc/group: no Group= (systemd would
		// fail to resolve it; without it systemd uses the passwd gid).
		appendFile(t, filepath.Join(e.root, "etc/passwd"), "agvnogrp:x:4243:4999::"+home+":/bin/sh\n")
		if _, err := c.CreateService(ctx, api.ServiceCreate{Name: "nogrp", Argv: []string{"true"}, User: "agvnogrp", NoStart: true}); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(e.root, "etc/systemd/system/agentvm-nogrp.service"))
		if !strings.Contains(string(b), "User=agvnogrp\n") || strings.Contains(string(b), "Group=") {
			t.Fatalf("unit file:\n%s", b)
		}
		if err := c.DeleteService(ctx, "nogrp"); err != nil {
			t.Fatal(err)
		}
		fake.takeCalls()
	})

	t.Run("get and list", func(t *testing.T) {
		fake.set("agentvm-web.service", "ActiveState", "activating", "SubState", "auto-restart", "MainPID", "0",
			"ExecMainStatus", "1", "NRestarts", "7", "ExecMainStartTimestamp", "@1700000500")
		si, err := c.GetService(ctx, "web")
		if err != nil {
			t.Fatal(err)
		}
		if si.ActiveState != "activating" || si.SubState != "auto-restart" || si.ExitCode != 1 || si.Restarts != 7 || si.MainPID != 0 ||
			!si.Since.Equal(time.Unix(1700000500, 0)) || !si.Enabled {
			t.Fatalf("info = %+v", si)
		}
		want := "systemctl show agentvm-web.service -p ActiveState,SubState,MainPID,ExecMainStatus,NRestarts,UnitFileState,ActiveEnterTimestamp,ExecMainStartTimestamp,LoadState --timestamp=unix"
		if s := fake.shows(); len(s) == 0 || s[len(s)-1] != want {
			t.Fatalf("show = %q", s)
		}
		fake.takeCalls()
		list, err := c.ListServices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].Name != "once.1" || list[1].Name != "web" || list[1].Restarts != 7 || list[0].Type != "oneshot" {
			t.Fatalf("list = %+v", list)
		}
		if s := fake.shows(); len(s) != 1 || !strings.HasPrefix(s[0], "systemctl show agentvm-once.1.service agentvm-web.service -p ") {
			t.Fatalf("list shows = %q", s)
		}
		for _, name := range []string{"nope", "a%2Fb", "a/b", "NOPE"} {
			_, err = c.GetService(ctx, name)
			if termAPIStatus(err) != 404 {
				t.Fatalf("get %q: %v", name, err)
			}
		}
		fake.takeCalls()
	})

	t.Run("actions", func(t *testing.T) {
		si, err := c.ServiceAction(ctx, "web", "stop")
		if err != nil || si.ActiveState != "inactive" || si.MainPID != 0 {
			t.Fatalf("stop = %+v, %v", si, err)
		}
		si, err = c.ServiceAction(ctx, "web", "start")
		if err != nil || si.ActiveState != "active" || si.MainPID != 4321 {
			t.Fatalf("start = %+v, %v", si, err)
		}
		si, err = c.ServiceAction(ctx, "web", "restart")
		if err != nil || si.ActiveState != "active" {
			t.Fatalf("restart = %+v, %v", si, err)
		}
		wantCalls(t, fake, "systemctl stop agentvm-web.service", "systemctl start agentvm-web.service", "systemctl restart agentvm-web.service")
		_, err = c.ServiceAction(ctx, "web", "reload")
		wantAPIError(t, err, 404, "http_404")
		_, err = c.ServiceAction(ctx, "nope", "start")
		wantAPIError(t, err, 404, "not_found")
		// A start that fails (a oneshot's command failed) reports the state.
		fake.mu.Lock()
		fake.fail["systemctl start"] = errors.New("Job for agentvm-web.service failed")
		fake.mu.Unlock()
		fake.set("agentvm-web.service", "ActiveState", "failed", "SubState", "failed")
		si, err = c.ServiceAction(ctx, "web", "start")
		if err != nil || si.ActiveState != "failed" {
			t.Fatalf("failed start = %+v, %v", si, err)
		}
		// One that systemd refuses (bad unit) is an error.
		fake.set("agentvm-web.service", "LoadState", "bad-setting")
		_, err = c.ServiceAction(ctx, "web", "start")
		wantAPIError(t, err, 500, "systemd", "failed", "bad-setting")
		fake.mu.Lock()
		delete(fake.fail, "systemctl start")
		fake.mu.Unlock()
		fake.set("agentvm-web.service", "LoadState", "loaded")
		fake.takeCalls()
	})

	t.Run("logs", func(t *testing.T) {
		fake.mu.Lock()
		fake.stream = func(ctx context.Context, w io.Writer, name string, args ...string) error {
			io.WriteString(w, "2024-01-01T00:00:00+0000 vm web[1]: one\n")
			io.WriteString(w, "2024-01-01T00:00:01+0000 vm web[1]: two\n")
			return nil
		}
		fake.mu.Unlock()
		rc, err := c.ServiceLogs(ctx, "web", 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(readAll(t, rc)); !strings.HasSuffix(got, "web[1]: two\n") || strings.Count(got, "\n") != 2 {
			t.Fatalf("logs = %q", got)
		}
		rc, err = c.ServiceLogs(ctx, "web", 50, false)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, rc)
		wantCalls(t, fake,
			"journalctl -u agentvm-web.service -o short-iso --no-pager -a -n 200",
			"journalctl -u agentvm-web.service -o short-iso --no-pager -a -n 50")

		// Follow: lines come as they are written; the reader's close stops
		// journalctl.
		next := make(chan string)
		stopped := make(chan error, 1)
		fake.mu.Lock()
		fake.stream = func(ctx context.Context, w io.Writer, name string, args ...string) error {
			for {
				select {
				case line := <-next:
					if _, err := io.WriteString(w, line); err != nil {
						stopped <- err
						return nil
					}
				case <-ctx.Done():
					stopped <- ctx.Err()
					return nil
				}
			}
		}
		fake.mu.Unlock()
		rc, err = c.ServiceLogs(ctx, "web", 10, true)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(rc)
		for _, s := range []string{"first\n", "second\n"} {
			next <- s
			line, err := br.ReadString('\n')
			if err != nil || line != s {
				t.Fatalf("follow read %q, %v", line, err)
			}
		}
		rc.Close()
		select {
		case <-stopped:
		case <-time.After(testWait):
			t.Fatal("journalctl -f not stopped after the client went away")
		}
		wantCalls(t, fake, "journalctl -u agentvm-web.service -o short-iso --no-pager -a -n 10 -f")

		_, err = c.ServiceLogs(ctx, "nope", 0, false)
		wantAPIError(t, err, 404, "not_found")
		_, err = c.ServiceLogs(ctx, "web", 100001, false)
		wantAPIError(t, err, 400, "invalid", "lines")
		// journalctl failing before any output is an API error.
		fake.mu.Lock()
		fake.stream = func(ctx context.Context, w io.Writer, name string, args ...string) error {
			return errors.New("journalctl: boom")
		}
		fake.mu.Unlock()
		_, err = c.ServiceLogs(ctx, "web", 0, false)
		wantAPIError(t, err, 500, "systemd", "boom")
		fake.takeCalls()
	})

	t.Run("rollback", func(t *testing.T) {
		fake.mu.Lock()
		fake.fail["systemctl enable"] = errors.New("systemctl enable: boom")
		fake.mu.Unlock()
		_, err := c.CreateService(ctx, api.ServiceCreate{Name: "broken", Argv: []string{"true"}})
		wantAPIError(t, err, 500, "systemd", "boom")
		fake.mu.Lock()
		delete(fake.fail, "systemctl enable")
		fake.mu.Unlock()
		for _, p := range []string{"etc/systemd/system/agentvm-broken.service", "var/lib/agentvm/services/broken.json"} {
			if _, err := os.Stat(filepath.Join(e.root, p)); !os.IsNotExist(err) {
				t.Errorf("%s left: %v", p, err)
			}
		}
		_, err = c.GetService(ctx, "broken")
		wantAPIError(t, err, 404, "not_found")
		fake.takeCalls()
	})

	t.Run("delete", func(t *testing.T) {
		if err := c.DeleteService(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, fake, "systemctl stop agentvm-web.service", "systemctl disable --no-reload agentvm-web.service",
			"systemctl daemon-reload", "systemctl reset-failed agentvm-web.service")
		for _, p := range []string{unitPath, filepath.Join(e.root, "var/lib/agentvm/services/web.json")} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left: %v", p, err)
			}
		}
		_, err := c.GetService(ctx, "web")
		wantAPIError(t, err, 404, "not_found")
		wantAPIError(t, c.DeleteService(ctx, "web"), 404, "not_found")
		list, err := c.ListServices(ctx)
		if err != nil || len(list) != 1 || list[0].Name != "once.1" {
			t.Fatalf("list = %+v, %v", list, err)
		}
		// The name is free again.
		if _, err := c.CreateService(ctx, api.ServiceCreate{Name: "web", Argv: []string{"true"}, NoStart: true}); err != nil {
			t.Fatal(err)
		}
	})
}

// dumpCommand is how systemd's unit dump shows a command line (Command
// Line:) whose arguments are argv: arguments are shown as parsed, before the
// exec-time substitution that turns $$ into $, so $ is doubled here.
func dumpCommand(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if i > 0 {
			a = strings.ReplaceAll(a, "$", "$$")
		}
		if a != "" && !strings.ContainsAny(a, " \t\n\"\\`$*?['()<>|&;!") {
			out[i] = a
			continue
		}
		var b strings.Builder
		b.WriteByte('"')
		for _, r := range a {
			switch r {
			case '"', '\\', '$', '`':
				b.WriteByte('\\')
				b.WriteRune(r)
			case '\t':
				b.WriteString(`\t`)
			default:
				b.WriteRune(r)
			}
		}
		b.WriteByte('"')
		out[i] = b.String()
	}
	return strings.Join(out, " ")
}

// checkUnitWithSystemd loads the unit file with the real systemd 252 parser
// (systemd-analyze verify dumps the parsed unit at debug level) and checks
// the parsed values: single-valued fields in want, Environment entries in
// env. ExecStart arguments keep $$ until exec time (where it becomes $),
// so the dump shows them escaped as \$\$.
func checkUnitWithSystemd(t *testing.T, unitPath string, want map[string]string, env []string) {
	t.Helper()
	ver, err := exec.Command("systemd-analyze", "--version").Output()
	if err != nil || !strings.HasPrefix(string(ver), "systemd 252") {
		t.Logf("systemd-analyze 252 not available (%v): unit file not checked with systemd", err)
		return
	}
	dir := t.TempDir()
	p := filepath.Join(dir, filepath.Base(unitPath))
	b, _ := os.ReadFile(unitPath)
	os.WriteFile(p, b, 0o644)
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", p)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=debug", "SYSTEMD_UNIT_PATH="+dir+":")
	out, _ := cmd.CombinedOutput()
	s := string(out)
	start := strings.Index(s, "-> Unit "+filepath.Base(unitPath)+":")
	if start < 0 {
		t.Fatalf("no dump of the unit in systemd-analyze output:\n%s", s)
	}
	s = s[start:]
	if i := strings.Index(s[1:], "-> Unit "); i >= 0 {
		s = s[:i+1]
	}
	// Complaints about the unit (other units' complaints are noise).
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, filepath.Base(unitPath)) && (strings.Contains(line, "ignoring") ||
			strings.Contains(line, "Unbalanced") || strings.Contains(line, "bad unit file") || strings.Contains(line, "rror")) {
			t.Errorf("systemd: %s", line)
		}
	}
	fields := map[string][]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if ok {
			fields[k] = append(fields[k], v)
		}
	}
	for k, v := range want {
		if len(fields[k]) == 0 || fields[k][0] != v {
			t.Errorf("systemd parsed %s = %q, want %q", k, fields[k], v)
		}
	}
	t.Logf("systemd parsed Command Line: %s", fields["Command Line"])
	gotEnv := fields["Environment"]
	wantEnv := append([]string(nil), env...)
	if v, ok := want["Environment"]; ok {
		wantEnv = append([]string{v}, wantEnv...)
	}
	sort.Strings(gotEnv)
	sort.Strings(wantEnv)
	if len(env) > 0 && strings.Join(gotEnv, "\n") != strings.Join(wantEnv, "\n") {
		t.Errorf("systemd parsed Environment = %q, want %q", gotEnv, wantEnv)
	}
}
