package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// Jobs are detached execs run by systemd as transient services
// agentvm-job-<id>.service with RemainAfterExit=yes (the unit and its exit
// status stay until the job is deleted), writing stdout and stderr to files
// in jobsDir/<id>/, next to job.json (what was requested; the final status
// once seen, so that it survives the unit: a reboot drops transient units).

const (
	jobsDir     = "/var/lib/agentvm/jobs"
	jobUnitPfx  = "agentvm-job-"
	jobMetaFile = "job.json"
	// jobPoll is the polling interval of wait and log follow; while the
	// main process exists (checked in /proc) systemd is asked at most every
	// jobShowEvery.
	jobPoll      = 100 * time.Millisecond
	jobShowEvery = 2 * time.Second
	jobLogChunk  = 256 << 10
)

var jobIDRE = regexp.MustCompile(`^j[0-9a-f]{8}$`)

var jobShowProps = "ActiveState,SubState,MainPID,ExecMainPID,ExecMainStatus,ExecMainCode,Result,ExecMainExitTimestamp,LoadState"

type jobManager struct {
	a  *Agent
	sd *systemd
}

func (a *Agent) registerJobs(mux *http.ServeMux, sd *systemd) {
	m := &jobManager{a: a, sd: sd}
	mux.HandleFunc("POST "+guest.PathJobs, m.handleStart)
	mux.HandleFunc("GET "+guest.PathJobs, m.handleList)
	mux.HandleFunc("GET "+guest.PathJobs+"/{id}", m.handleGet)
	mux.HandleFunc("DELETE "+guest.PathJobs+"/{id}", m.handleDelete)
	mux.HandleFunc("GET "+guest.PathJobs+"/{id}/logs", m.handleLogs)
	mux.HandleFunc("POST "+guest.PathJobs+"/{id}/wait", m.handleWait)
	mux.HandleFunc("POST "+guest.PathJobs+"/{id}/signal", m.handleSignal)
}

// lookup loads the job named in the request path, or answers 404.
func (m *jobManager) lookup(w http.ResponseWriter, r *http.Request) *jobMeta {
	id := r.PathValue("id")
	meta, err := m.load(id)
	if err == errNoJob {
		writeError(w, http.StatusNotFound, "not_found", "no job "+strconv.Quote(id))
		return nil
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return nil
	}
	return meta
}

func newJobID() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "j" + hex.EncodeToString(b), nil
}

// jobArgs is the systemd-run command line of a job.
func jobArgs(id, dir string, sp *execSpec, u *userInfo, group string) []string {
	args := []string{
		"--unit=" + jobUnitPfx + id,
		"--quiet",
		"--no-ask-password",
		"--property=RemainAfterExit=yes",
		"--property=StandardOutput=file:" + filepath.Join(dir, "stdout"),
		"--property=StandardError=file:" + filepath.Join(dir, "stderr"),
	}
	if sp.timeout > 0 {
		ms := (sp.timeout + time.Millisecond - 1) / time.Millisecond
		args = append(args, "--property=RuntimeMaxSec="+strconv.FormatInt(int64(ms), 10)+"ms")
	}
	args = append(args, "--uid="+u.Name)
	if group != "" {
		args = append(args, "--gid="+group)
	}
	args = append(args, "--working-directory="+sp.dir)
	env := append([]string(nil), sp.env...)
	sort.Strings(env)
	for _, kv := range env {
		args = append(args, "--setenv="+kv)
	}
	// systemd substitutes $VAR and ${VAR} in the arguments of transient
	// units too (systemd-run of systemd 252 cannot turn that off): $$ is a
	// literal $. The executable path is not substituted.
	args = append(args, "--", sp.path)
	for _, a := range sp.argv[1:] {
		args = append(args, strings.ReplaceAll(a, "$", "$$"))
	}
	return args
}

// checkJobSpec refuses what systemd would refuse (D-Bus strings are UTF-8
// without NUL; environment values may hold tabs and newlines only).
func checkJobSpec(sp *execSpec) error {
	for i, a := range sp.argv {
		if !utf8.ValidString(a) || strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("argv[%d] %q is not valid UTF-8 or contains NUL", i, a)
		}
	}
	if !utf8.ValidString(sp.dir) || strings.IndexByte(sp.dir, 0) >= 0 {
		return fmt.Errorf("cwd %q is not valid UTF-8 or contains NUL", sp.dir)
	}
	for _, kv := range sp.env {
		k, v, _ := strings.Cut(kv, "=")
		if !envNameRE.MatchString(k) {
			return fmt.Errorf("invalid env name %q (want [A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("env %s is not valid UTF-8", k)
		}
		for _, r := range v {
			if (r < 0x20 && r != '\t' && r != '\n') || r == 0x7f {
				return fmt.Errorf("env %s contains a control character", k)
			}
		}
	}
	return nil
}

func (m *jobManager) handleStart(w http.ResponseWriter, r *http.Request) {
	var req guest.ExecRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad job JSON: "+err.Error())
		return
	}
	if req.Stdin {
		writeError(w, http.StatusBadRequest, "invalid", "jobs have no stdin")
		return
	}
	sp, err := m.a.prepareExec(&req)
	if err == nil {
		err = sp.lookErr
	}
	if err == nil {
		err = checkJobSpec(sp)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	u, err := m.a.users.lookup(req.User)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if err := os.MkdirAll(m.a.path(jobsDir), 0o755); err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	var id string
	for {
		if id, err = newJobID(); err == nil {
			err = os.Mkdir(m.dir(id), 0o755)
		}
		if !os.IsExist(err) {
			break
		}
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	dir := m.dir(id)
	meta := &jobMeta{JobInfo: api.JobInfo{ID: id, Argv: sp.argv, User: u.Name, StartedAt: time.Now().UTC()}}
	err = os.Chown(dir, int(u.UID), int(u.GID))
	if err == nil {
		err = m.save(meta)
	}
	if err != nil {
		os.RemoveAll(dir)
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	// Not cancelled with the request: once asked, the unit may start.
	if _, err := m.sd.run(context.WithoutCancel(r.Context()), "systemd-run", jobArgs(id, dir, sp, u, m.a.primaryGroup(u))...); err != nil {
		m.sd.run(context.Background(), "systemctl", "reset-failed", jobUnit(id))
		os.RemoveAll(dir)
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	ji, err := m.info(r.Context(), meta)
	if err != nil {
		ji = &meta.JobInfo
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(ji)
}

func (m *jobManager) handleList(w http.ResponseWriter, r *http.Request) {
	ents, err := os.ReadDir(m.a.path(jobsDir))
	if err != nil && !os.IsNotExist(err) {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	var metas []*jobMeta
	for _, e := range ents {
		if !e.IsDir() || !jobIDRE.MatchString(e.Name()) {
			continue
		}
		if meta, err := m.load(e.Name()); err == nil {
			metas = append(metas, meta)
		}
	}
	infos, err := m.infos(r.Context(), metas)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	sort.SliceStable(infos, func(i, j int) bool {
		if !infos[i].StartedAt.Equal(infos[j].StartedAt) {
			return infos[i].StartedAt.Before(infos[j].StartedAt)
		}
		return infos[i].ID < infos[j].ID
	})
	writeJSON(w, api.JobList{Jobs: infos})
}

func (m *jobManager) handleGet(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	ji, err := m.info(r.Context(), meta)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	writeJSON(w, ji)
}

func (m *jobManager) handleWait(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	var deadline <-chan time.Time
	if s := r.URL.Query().Get("timeout_ms"); s != "" {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil || ms < 0 {
			writeError(w, http.StatusBadRequest, "invalid", "timeout_ms must be a number >= 0")
			return
		}
		if ms > 0 {
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer t.Stop()
			deadline = t.C
		}
	}
	ctx := r.Context()
	jw := &jobWatch{m: m, meta: meta}
	tick := time.NewTicker(jobPoll)
	defer tick.Stop()
	for {
		ji, err := jw.poll(ctx)
		if err != nil {
			if ctx.Err() == nil {
				writeError(w, http.StatusInternalServerError, "systemd", err.Error())
			}
			return
		}
		if ji.Exited {
			writeJSON(w, ji)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			if ji, err = m.info(ctx, meta); err != nil {
				writeError(w, http.StatusInternalServerError, "systemd", err.Error())
				return
			}
			writeJSON(w, ji)
			return
		case <-tick.C:
		}
	}
}

func (m *jobManager) handleSignal(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	sig, ok := readSignal(w, r)
	if !ok {
		return
	}
	ji, err := m.info(r.Context(), meta)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "systemd", err.Error())
		return
	}
	if !ji.Exited { // signalling an exited job is a no-op, as for terminals
		if _, err := m.sd.run(r.Context(), "systemctl", "kill", "--signal="+signalArg(sig), jobUnit(meta.ID)); err != nil {
			// It may have exited meanwhile.
			if ji, ierr := m.info(r.Context(), meta); ierr != nil || !ji.Exited {
				writeError(w, http.StatusInternalServerError, "systemd", err.Error())
				return
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// signalArg names sig for systemctl kill --signal= ("SIGTERM", or the
// number for real-time signals).
func signalArg(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return strconv.Itoa(int(sig))
}

func (m *jobManager) handleDelete(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	ctx := r.Context()
	unit := jobUnit(meta.ID)
	// Errors are expected here (no process left to kill, unit already
	// gone after a reboot): the unit must just not be left running.
	if !meta.Final {
		m.sd.run(ctx, "systemctl", "kill", "--signal=SIGKILL", unit)
	}
	if _, err := m.sd.run(ctx, "systemctl", "stop", unit); err != nil {
		m.a.logf("job %s: %v", meta.ID, err)
	}
	m.sd.run(ctx, "systemctl", "reset-failed", unit)
	if err := os.RemoveAll(m.dir(meta.ID)); err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (m *jobManager) handleLogs(w http.ResponseWriter, r *http.Request) {
	meta := m.lookup(w, r)
	if meta == nil {
		return
	}
	q := r.URL.Query()
	stream := q.Get("stream")
	if stream == "" {
		stream = "stdout"
	}
	var files []string
	switch stream {
	case "stdout", "stderr":
		files = []string{stream}
	case "both":
		files = []string{"stdout", "stderr"}
	default:
		writeError(w, http.StatusBadRequest, "invalid", "stream must be stdout, stderr or both")
		return
	}
	var offset int64
	if s := q.Get("offset"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "invalid", "offset must be a number >= 0")
			return
		}
		offset = n
	}
	follow, err := queryBool(q.Get("follow"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "follow: "+err.Error())
		return
	}
	if follow && len(files) > 1 {
		writeError(w, http.StatusBadRequest, "invalid", "follow needs a single stream (stdout or stderr)")
		return
	}
	for i, f := range files {
		files[i] = filepath.Join(m.dir(meta.ID), f)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !follow {
		m.copyLogs(w, files, offset)
		return
	}
	m.followLog(w, r, meta, files[0], offset)
}
