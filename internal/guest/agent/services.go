package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
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

func serviceInfo(meta *svcMeta, p map[string]string) api.ServiceInfo {
	si := api.ServiceInfo{
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

func (m *svcManager) info(ctx context.Context, meta *svcMeta) (*api.ServiceInfo, map[string]string, error) {
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
	list := api.ServiceList{Services: make([]api.ServiceInfo, 0, len(metas))}
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
	var req api.ServiceCreate
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
		m.sd.run(context.Background(), "systemctl", "disable", "--no-reload", unit)
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
	// One reload: enable and disable would each reload systemd again (1.6 s
	// apiece under TCG), and the reload before or after them covers them.
	steps := [][]string{{"daemon-reload"}}
	if !req.NoBoot {
		steps = append(steps, []string{"enable", "--no-reload", unit})
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

	var si *api.ServiceInfo
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
func (m *svcManager) start(ctx context.Context, meta *svcMeta, verb string) (*api.ServiceInfo, error) {
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
	var si *api.ServiceInfo
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
	if _, err := m.sd.run(ctx, "systemctl", "disable", "--no-reload", unit); err != nil {
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
