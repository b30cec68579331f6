package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agentvm/agentvm/internal/guest"
)

// Services are systemd units /etc/systemd/system/agentvm-<name>.service
// written by the agent, with a JSON sidecar in svcMetaDir keeping what was
// requested (the unit file holds the resolved command). A service exists for
// the API when its sidecar exists.

const (
	svcUnitDir    = "/etc/systemd/system"
	svcMetaDir    = "/var/lib/agentvm/services"
	svcUnitPrefix = "agentvm-"
	// svcStartWait bounds the wait for a start or restart job (a oneshot
	// service stays "activating" while it runs).
	svcStartWait = 2 * time.Second
	// svcLogsDefault and svcLogsMax bound ?lines= of the logs endpoint.
	svcLogsDefault = 200
	svcLogsMax     = 100000
)

// Unit directories where a unit of the same name would collide with a new
// service (an existing unit file, the agent's own unit, a transient unit).
var svcUnitSearchDirs = []string{
	"/etc/systemd/system", "/run/systemd/system", "/run/systemd/transient",
	"/lib/systemd/system", "/usr/lib/systemd/system",
}

var svcNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// svcShowProps are the properties read with systemctl show for a service.
var svcShowProps = "ActiveState,SubState,MainPID,ExecMainStatus,NRestarts,UnitFileState,ActiveEnterTimestamp,ExecMainStartTimestamp,LoadState"

// systemd runs systemctl, systemd-run and journalctl. Tests replace it
// (see systemdFor) since they cannot talk to a real service manager.
type systemd struct {
	// run runs a command to completion and returns its standard output; a
	// non-zero exit is an error that carries the command's stderr.
	run func(ctx context.Context, name string, args ...string) ([]byte, error)
	// stream runs a command and copies its standard output to w as it
	// comes, until the command exits or ctx ends (then it is stopped).
	stream func(ctx context.Context, w io.Writer, name string, args ...string) error
}

// systemdFor returns the systemd access used by an agent (tests swap it).
var systemdFor = func(a *Agent) *systemd { return hostSystemd() }

func hostSystemd() *systemd {
	cmd := func(ctx context.Context, name string, args []string) *exec.Cmd {
		c := exec.CommandContext(ctx, name, args...)
		c.Env = append(os.Environ(), "SYSTEMD_PAGER=cat", "SYSTEMD_COLORS=0")
		c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
		c.WaitDelay = 2 * time.Second
		return c
	}
	return &systemd{
		run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			c := cmd(ctx, name, args)
			var stderr bytes.Buffer
			c.Stderr = &limitedBuffer{b: &stderr, max: 16 << 10}
			out, err := c.Output()
			if err != nil {
				return out, cmdError(name, args, err, stderr.Bytes())
			}
			return out, nil
		},
		stream: func(ctx context.Context, w io.Writer, name string, args ...string) error {
			c := cmd(ctx, name, args)
			var stderr bytes.Buffer
			c.Stderr = &limitedBuffer{b: &stderr, max: 16 << 10}
			c.Stdout = w
			if err := c.Run(); err != nil && ctx.Err() == nil {
				return cmdError(name, args, err, stderr.Bytes())
			}
			return nil
		},
	}
}

func cmdError(name string, args []string, err error, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	if msg == "" {
		msg = err.Error()
	}
	verb := name
	if len(args) > 0 {
		verb += " " + args[0]
	}
	return fmt.Errorf("%s: %s", verb, msg)
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		if len(p) < room {
			room = len(p)
		}
		l.b.Write(p[:room])
	}
	return len(p), nil
}

// show runs systemctl show for units and returns one property map per unit,
// in order.
func (sd *systemd) show(ctx context.Context, props string, units ...string) ([]map[string]string, error) {
	args := append([]string{"show"}, units...)
	args = append(args, "-p", props, "--timestamp=unix")
	out, err := sd.run(ctx, "systemctl", args...)
	if err != nil {
		return nil, err
	}
	blocks := parseShow(out)
	if len(blocks) != len(units) {
		return nil, fmt.Errorf("systemctl show: %d units in the output, want %d", len(blocks), len(units))
	}
	return blocks, nil
}

// parseShow parses systemctl show output: key=value lines, one block per
// unit, blocks separated by an empty line.
func parseShow(out []byte) []map[string]string {
	var blocks []map[string]string
	var cur map[string]string
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" {
			if cur != nil {
				blocks = append(blocks, cur)
				cur = nil
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if cur == nil {
			cur = map[string]string{}
		}
		cur[k] = v
	}
	if cur != nil {
		blocks = append(blocks, cur)
	}
	return blocks
}

// showTime parses a --timestamp=unix value ("@1700000000"; empty when unset).
func showTime(v string) time.Time {
	v = strings.TrimPrefix(strings.TrimSpace(v), "@")
	if v == "" {
		return time.Time{}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return time.Time{}
	}
	sec := int64(f)
	return time.Unix(sec, int64((f-float64(sec))*1e9))
}

func showInt(v string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(v))
	return n
}

// Escaping for unit files (systemd.syntax(7)). Values are written as one
// double-quoted word: inside it \ and " are escaped with a backslash and a
// tab as \t (ExecStart= and Environment= unquote and C-unescape each word),
// % is doubled (specifiers are expanded after unquoting), and in command
// lines $ is doubled (ExecStart= substitutes $VAR and ${VAR} at exec time;
// $$ is a literal $). Environment= does no $ substitution. Other control
// characters (newlines included) and invalid UTF-8 are refused.

func unitQuote(s string, dollar bool) (string, error) {
	if err := unitCheck(s); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\t':
			b.WriteString(`\t`)
		case '%':
			b.WriteString("%%")
		case '$':
			if dollar {
				b.WriteString("$$")
			} else {
				b.WriteByte('$')
			}
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}

// unitCheck refuses what cannot be written in a unit file value.
func unitCheck(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%q is not valid UTF-8", s)
	}
	for _, r := range s {
		if (r < 0x20 && r != '\t') || r == 0x7f {
			if r == '\n' {
				return fmt.Errorf("%q contains a newline", s)
			}
			return fmt.Errorf("%q contains a control character", s)
		}
	}
	return nil
}

// unitPlain escapes a value that is not unquoted by systemd (paths, names):
// only specifiers; no control characters, no surrounding white space.
func unitPlain(s string) (string, error) {
	if err := unitCheck(s); err != nil {
		return "", err
	}
	if strings.ContainsRune(s, '\t') || strings.TrimSpace(s) != s {
		return "", fmt.Errorf("%q has leading or trailing white space or a tab", s)
	}
	return strings.ReplaceAll(s, "%", "%%"), nil
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// svcSpec is a validated service request.
type svcSpec struct {
	name    string
	argv    []string // as requested (the /bin/sh -c form for a shell)
	path    string   // resolved executable
	user    *userInfo
	group   string // the primary gid, "" when /etc/group lacks it
	dir     string
	env     []string // sorted K=V
	restart string
	typ     string
}

func (m *svcManager) validate(req *guest.ServiceCreate) (*svcSpec, error) {
	if !svcNameRE.MatchString(req.Name) {
		return nil, fmt.Errorf("invalid service name %q (want [a-z0-9][a-z0-9_.-]{0,62})", req.Name)
	}
	if req.Name == "guest" || strings.HasPrefix(req.Name, "job-") {
		return nil, fmt.Errorf("service name %q is reserved", req.Name)
	}
	sp := &svcSpec{name: req.Name, restart: req.Restart, typ: req.Type}
	if sp.restart == "" {
		sp.restart = "on-failure"
	}
	if sp.typ == "" {
		sp.typ = "simple"
	}
	switch sp.restart {
	case "no", "on-failure", "always":
	default:
		return nil, fmt.Errorf("invalid restart %q (want no, on-failure or always)", req.Restart)
	}
	switch sp.typ {
	case "simple", "oneshot":
	default:
		return nil, fmt.Errorf("invalid type %q (want simple or oneshot)", req.Type)
	}
	if sp.typ == "oneshot" && sp.restart == "always" {
		return nil, errors.New("restart=always is not allowed for a oneshot service")
	}
	ex, err := m.a.prepareExec(&guest.ExecRequest{Argv: req.Argv, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		return nil, err
	}
	if ex.lookErr != nil {
		return nil, ex.lookErr
	}
	if sp.user, err = m.a.users.lookup(req.User); err != nil {
		return nil, err
	}
	sp.group = m.a.primaryGroup(sp.user)
	sp.argv, sp.path, sp.dir = ex.argv, ex.path, ex.dir
	if !filepath.IsAbs(sp.path) {
		return nil, fmt.Errorf("command %q does not resolve to an absolute path", sp.argv[0])
	}
	if strings.ContainsAny(sp.path, "\"'\\") {
		return nil, fmt.Errorf("executable path %q contains a quote or a backslash (systemd refuses it)", sp.path)
	}
	// systemd sets these from User= (to the same values unless overridden).
	implied := map[string]string{"HOME": sp.user.Home, "USER": sp.user.Name, "LOGNAME": sp.user.Name, "SHELL": sp.user.Shell}
	for _, kv := range ex.env {
		k, v, _ := strings.Cut(kv, "=")
		if iv, ok := implied[k]; ok && iv == v {
			continue
		}
		if !envNameRE.MatchString(k) {
			return nil, fmt.Errorf("invalid env name %q (want [A-Za-z_][A-Za-z0-9_]*)", k)
		}
		sp.env = append(sp.env, kv)
	}
	sort.Strings(sp.env)
	return sp, nil
}

// unitFile renders the unit for sp.
func (sp *svcSpec) unitFile() (string, error) {
	var b strings.Builder
	fail := func(what string, err error) (string, error) {
		return "", fmt.Errorf("%s: %v", what, err)
	}
	b.WriteString("# Created by the agentvm guest agent (" + guest.PathServices + ").\n")
	b.WriteString("[Unit]\nDescription=agentvm service " + sp.name + "\nAfter=network.target\n\n[Service]\n")
	b.WriteString("Type=" + sp.typ + "\nExecStart=")
	for i, arg := range sp.argv {
		if i == 0 {
			arg = sp.path
		}
		q, err := unitQuote(arg, i > 0)
		if err != nil {
			return fail(fmt.Sprintf("argv[%d]", i), err)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(q)
	}
	b.WriteByte('\n')
	user, err := unitPlain(sp.user.Name)
	if err != nil {
		return fail("user", err)
	}
	dir, err := unitPlain(sp.dir)
	if err != nil {
		return fail("cwd", err)
	}
	b.WriteString("User=" + user + "\n")
	if sp.group != "" {
		b.WriteString("Group=" + sp.group + "\n")
	}
	b.WriteString("WorkingDirectory=" + dir + "\n")
	for _, kv := range sp.env {
		q, err := unitQuote(kv, false)
		if err != nil {
			k, _, _ := strings.Cut(kv, "=")
			return fail("env "+k, err)
		}
		b.WriteString("Environment=" + q + "\n")
	}
	b.WriteString("Restart=" + sp.restart + "\nRestartSec=1\n")
	if sp.typ == "oneshot" {
		b.WriteString("RemainAfterExit=no\n")
	}
	b.WriteString("StandardOutput=journal\n\n[Install]\nWantedBy=multi-user.target\n")
	return b.String(), nil
}

// primaryGroup returns u's primary gid for Group= (systemd-run --gid=), or
// "" when /etc/group has no such group: systemd fails a numeric Group= it
// cannot resolve (216/GROUP), while without Group= it uses the passwd gid,
// which is the same group.
func (a *Agent) primaryGroup(u *userInfo) string {
	gid := strconv.FormatUint(uint64(u.GID), 10)
	b, err := os.ReadFile(a.path("/etc/group"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 3 && f[2] == gid && !strings.HasPrefix(f[0], "#") {
			return gid
		}
	}
	return ""
}

// svcMeta is the sidecar of a service.
type svcMeta struct {
	Name      string    `json:"name"`
	Argv      []string  `json:"argv"`
	User      string    `json:"user"`
	Restart   string    `json:"restart"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
}

type svcManager struct {
	a  *Agent
	sd *systemd
	mu sync.Mutex // serializes create and delete
}

func svcUnit(name string) string { return svcUnitPrefix + name + ".service" }

func (m *svcManager) unitPath(name string) string {
	return m.a.path(filepath.Join(svcUnitDir, svcUnit(name)))
}

func (m *svcManager) metaPath(name string) string {
	return m.a.path(filepath.Join(svcMetaDir, name+".json"))
}

// registerServices adds the service, process and job endpoints (see
// guest.PathServices).
func (a *Agent) registerServices(mux *http.ServeMux) {
	sd := systemdFor(a)
	m := &svcManager{a: a, sd: sd}
	mux.HandleFunc("GET "+guest.PathServices, m.handleList)
	mux.HandleFunc("POST "+guest.PathServices, m.handleCreate)
	mux.HandleFunc("GET "+guest.PathServices+"/{name}", m.handleGet)
	mux.HandleFunc("DELETE "+guest.PathServices+"/{name}", m.handleDelete)
	for _, action := range []string{"start", "stop", "restart"} {
		mux.HandleFunc("POST "+guest.PathServices+"/{name}/"+action, func(w http.ResponseWriter, r *http.Request) {
			m.handleAction(w, r, action)
		})
	}
	mux.HandleFunc("GET "+guest.PathServices+"/{name}/logs", m.handleLogs)

	mux.HandleFunc("GET "+guest.PathProcesses, a.handleProcList)
	mux.HandleFunc("POST "+guest.PathProcesses+"/{pid}/signal", a.handleProcSignal)

	a.registerJobs(mux, sd)
}

// loadMeta reads the sidecar; a missing one is errNoService.
func (m *svcManager) loadMeta(name string) (*svcMeta, error) {
	if !svcNameRE.MatchString(name) {
		return nil, errNoService
	}
	b, err := os.ReadFile(m.metaPath(name))
	if os.IsNotExist(err) {
		return nil, errNoService
	}
	if err != nil {
		return nil, err
	}
	var meta svcMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("service %s: bad %s: %v", name, m.metaPath(name), err)
	}
	meta.Name = name
	return &meta, nil
}

var errNoService = errors.New("no such service")

// lookup loads the service named in the request path, or answers 404.
func (m *svcManager) lookup(w http.ResponseWriter, r *http.Request) *svcMeta {
	name := r.PathValue("name")
	meta, err := m.loadMeta(name)
	if err == errNoService {
		writeError(w, http.StatusNotFound, "not_found", "no service "+strconv.Quote(name))
		return nil
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return nil
	}
	return meta
}

func serviceInfo(meta *svcMeta, p map[string]string) guest.ServiceInfo {
	si := guest.ServiceInfo{
		Name: meta.Name, Unit: svcUnit(meta.Name), Argv: meta.Argv, User: meta.User,
		Restart: meta.Restart, Type: meta.Type,
		Enabled:     strings.HasPrefix(p["UnitFileState"], "enabled"),
		ActiveState: p["ActiveState"], SubState: p["SubState"],
		MainPID: showInt(p["MainPID"]), ExitCode: showInt(p["ExecMainStatus"]),
		Restarts: showInt(p["NRestarts"]),
	}
	if si.ActiveState == "active" || si.ActiveState == "reloading" {
		si.Since = showTime(p["ActiveEnterTimestamp"])
	}
	if si.Since.IsZero() {
		si.Since = showTime(p["ExecMainStartTimestamp"])
	}
	if si.Argv == nil {
		si.Argv = []string{}
	}
	return si
}

func (m *svcManager) info(ctx context.Context, meta *svcMeta) (*guest.ServiceInfo, map[string]string, error) {
	blocks, err := m.sd.show(ctx, svcShowProps, svcUnit(meta.Name))
	if err != nil {
		return nil, nil, err
	}
	si := serviceInfo(meta, blocks[0])
	return &si, blocks[0], nil
}

func (m *svcManager) handleList(w http.ResponseWriter, r *http.Request) {
	ents, err := os.ReadDir(m.a.path(svcMetaDir))
	if err != nil && !os.IsNotExist(err) {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	var metas []*svcMeta
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !svcNameRE.MatchString(name) {
			continue
		}
		meta, err := m.loadMeta(name)
		if err != nil {
			continue // deleted meanwhile, or unreadable
		}
		metas = append(metas, meta)
	}
	sort.Slice(metas, func(i, j int) bool { return metas[i].Name < metas[j].Name })
	list := guest.ServiceList{Services: make([]guest.ServiceInfo, 0, len(metas))}
	if len(metas) > 0 {
		units := make([]string, len(metas))
		for i, meta := range metas {
			units[i] = svcUnit(meta.Name)
		}
		blocks, err := m.sd.show(r.Context(), svcShowProps, units...)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "systemd", err.Error())
			return
		}
		for i, meta := range metas {
			list.Services = append(list.Services, serviceInfo(meta, blocks[i]))
		}
	}
	writeJSON(w, list)
}

func (m *svcManager) handleGet(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	si, _, err := m.info(r.Context(), meta)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	writeJSON(w, si)
}

// unitExists reports whether a unit file called unit exists in any unit
// directory.
func (m *svcManager) unitExists(unit string) bool {
	for _, d := range svcUnitSearchDirs {
		if _, err := os.Lstat(m.a.path(filepath.Join(d, unit))); err == nil {
			return true
		}
	}
	return false
}

func (m *svcManager) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req guest.ServiceCreate
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad service JSON: "+err.Error())
		return
	}
	sp, err := m.validate(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	text, err := sp.unitFile()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	meta := &svcMeta{Name: sp.name, Argv: sp.argv, User: sp.user.Name, Restart: sp.restart, Type: sp.typ, CreatedAt: time.Now().UTC()}
	metaJSON, _ := json.Marshal(meta)
	// A client that goes away does not leave a half-made service behind.
	ctx := context.WithoutCancel(r.Context())
	unit := svcUnit(sp.name)

	m.mu.Lock()
	if _, err := os.Lstat(m.metaPath(sp.name)); err == nil || m.unitExists(unit) {
		m.mu.Unlock()
		writeError(w, http.StatusConflict, "exists", "service "+strconv.Quote(sp.name)+" exists (unit "+unit+")")
		return
	}
	undo := func() {
		m.sd.run(context.Background(), "systemctl", "stop", unit)
		m.sd.run(context.Background(), "systemctl", "disable", unit)
		os.Remove(m.unitPath(sp.name))
		os.Remove(m.metaPath(sp.name))
		m.sd.run(context.Background(), "systemctl", "daemon-reload")
		m.sd.run(context.Background(), "systemctl", "reset-failed", unit)
	}
	err = os.MkdirAll(filepath.Dir(m.unitPath(sp.name)), 0o755)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(m.metaPath(sp.name)), 0o755)
	}
	if err == nil {
		err = writeFileAtomic(m.unitPath(sp.name), []byte(text), 0o644)
	}
	if err == nil {
		err = writeFileAtomic(m.metaPath(sp.name), metaJSON, 0o644)
	}
	if err != nil {
		os.Remove(m.unitPath(sp.name))
		os.Remove(m.metaPath(sp.name))
		m.mu.Unlock()
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	steps := [][]string{{"daemon-reload"}}
	if !req.NoBoot {
		steps = append(steps, []string{"enable", unit})
	}
	for _, args := range steps {
		if _, err := m.sd.run(ctx, "systemctl", args...); err != nil {
			undo()
			m.mu.Unlock()
			writeError(w, http.StatusInternalServerError, "systemd", err.Error())
			return
		}
	}
	m.mu.Unlock()

	var si *guest.ServiceInfo
	if req.NoStart {
		si, _, err = m.info(ctx, meta)
	} else {
		si, err = m.start(ctx, meta, "start")
	}
	if err != nil {
		m.mu.Lock()
		undo()
		m.mu.Unlock()
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(si)
}

// start runs systemctl start (or restart) and waits up to svcStartWait for
// the job: a simple service's start job ends once the process is forked, a
// oneshot's when it has finished (past the wait it is still "activating";
// stopping the systemctl client does not cancel the job). A failed start
// is not an error: the info shows it. An error means systemd could not
// start the unit at all (it is not loaded).
func (m *svcManager) start(ctx context.Context, meta *svcMeta, verb string) (*guest.ServiceInfo, error) {
	sctx, cancel := context.WithTimeout(ctx, svcStartWait)
	_, startErr := m.sd.run(sctx, "systemctl", verb, svcUnit(meta.Name))
	waited := sctx.Err() != nil // the job was still running: not an error
	cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	si, props, err := m.info(ctx, meta)
	if err != nil {
		return nil, err
	}
	if startErr != nil && !waited && props["LoadState"] != "loaded" {
		return nil, fmt.Errorf("%v (LoadState=%s)", startErr, props["LoadState"])
	}
	return si, nil
}

func (m *svcManager) handleAction(w http.ResponseWriter, r *http.Request, action string) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	var si *guest.ServiceInfo
	var err error
	if action == "stop" {
		if _, err = m.sd.run(r.Context(), "systemctl", "stop", svcUnit(meta.Name)); err == nil {
			si, _, err = m.info(r.Context(), meta)
		}
	} else {
		si, err = m.start(r.Context(), meta, action)
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	writeJSON(w, si)
}

func (m *svcManager) handleDelete(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	ctx := context.WithoutCancel(r.Context())
	unit := svcUnit(meta.Name)
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.sd.run(ctx, "systemctl", "stop", unit); err != nil {
		m.a.logf("service %s: %v", meta.Name, err)
	}
	if _, err := m.sd.run(ctx, "systemctl", "disable", unit); err != nil {
		m.a.logf("service %s: %v", meta.Name, err)
	}
	for _, p := range []string{m.unitPath(meta.Name), m.metaPath(meta.Name)} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
	}
	if _, err := m.sd.run(ctx, "systemctl", "daemon-reload"); err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	m.sd.run(ctx, "systemctl", "reset-failed", unit) // fails when the unit is gone already
	w.WriteHeader(http.StatusNoContent)
}

func (m *svcManager) handleLogs(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	q := r.URL.Query()
	lines := svcLogsDefault
	if s := q.Get("lines"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > svcLogsMax {
			writeError(w, http.StatusBadRequest, "invalid", "lines must be between 0 and "+strconv.Itoa(svcLogsMax))
			return
		}
		lines = n
	}
	follow, err := queryBool(q.Get("follow"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "follow: "+err.Error())
		return
	}
	args := []string{"-u", svcUnit(meta.Name), "-o", "short-iso", "--no-pager", "-a", "-n", strconv.Itoa(lines)}
	if follow {
		args = append(args, "-f")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	if follow {
		// Answer now: the client gets its stream before the first line.
		w.WriteHeader(http.StatusOK)
		fw.rc.Flush()
		fw.wrote = true
	}
	err = m.sd.stream(r.Context(), fw, "journalctl", args...)
	if err != nil && r.Context().Err() == nil {
		if !fw.wrote {
			w.Header().Del("X-Content-Type-Options")
			writeError(w, http.StatusInternalServerError, "systemd", err.Error())
			return
		}
		fmt.Fprintf(fw, "\n-- agentvm: %v --\n", err)
	}
}

// flushWriter flushes each write to the client.
type flushWriter struct {
	w     io.Writer
	rc    *http.ResponseController
	wrote bool
}

func (f *flushWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f.wrote = true
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

func queryBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	return strconv.ParseBool(s)
}

// writeFileAtomic writes path through a temporary file and a rename.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
