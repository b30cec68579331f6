package agent

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentvm/agentvm/internal/guest"
)

const (
	termDefaultCols = 80
	termDefaultRows = 24
	termMaxDim      = 1000
	termDefaultTERM = "xterm-256color"
)

var termNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// validTermName reports whether name may name a terminal. "." and ".."
// match the pattern but cannot be used as a URL path segment.
func validTermName(name string) bool {
	return termNameRE.MatchString(name) && name != "." && name != ".."
}

// termManager owns the agent's terminals. Terminals live independently of
// the agent session: a session that dies only detaches its clients.
type termManager struct {
	a *Agent

	mu    sync.Mutex
	terms map[string]*terminal // nil value: name reserved while starting
	seq   int
}

// registerTerms adds the terminal and TCP endpoints (see guest.PathTerms).
func (a *Agent) registerTerms(mux *http.ServeMux) {
	m := &termManager{a: a, terms: map[string]*terminal{}}
	mux.HandleFunc("GET "+guest.PathTerms, m.handleList)
	mux.HandleFunc("POST "+guest.PathTerms, m.handleCreate)
	mux.HandleFunc("GET "+guest.PathTerms+"/{name}", m.handleGet)
	mux.HandleFunc("DELETE "+guest.PathTerms+"/{name}", m.handleDelete)
	mux.HandleFunc("POST "+guest.PathTerms+"/{name}/attach", m.handleAttach)
	mux.HandleFunc("POST "+guest.PathTerms+"/{name}/resize", m.handleResize)
	mux.HandleFunc("POST "+guest.PathTerms+"/{name}/signal", m.handleSignal)
	mux.HandleFunc("POST "+guest.PathTCP, a.handleTCP)
	a.registerTCPListen(mux)
}

// get returns the terminal called name, or nil.
func (m *termManager) get(name string) *terminal {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.terms[name]
}

// remove takes the terminal out of the table (if it is still the one
// registered under its name) and reports whether it did.
func (m *termManager) remove(t *terminal) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.terms[t.name] != t {
		return false
	}
	delete(m.terms, t.name)
	return true
}

func (m *termManager) lookup(w http.ResponseWriter, r *http.Request) *terminal {
	name := r.PathValue("name")
	if t := m.get(name); t != nil {
		return t
	}
	writeError(w, http.StatusNotFound, "not_found", "no terminal "+strconv.Quote(name))
	return nil
}

// decodeBody decodes an optional JSON body and consumes the rest of it.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	err := json.NewDecoder(body).Decode(v)
	if err == io.EOF {
		err = nil
	}
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	return err
}

func checkSize(cols, rows int) error {
	if cols < 1 || cols > termMaxDim || rows < 1 || rows > termMaxDim {
		return errors.New("cols and rows must be between 1 and " + strconv.Itoa(termMaxDim))
	}
	return nil
}

func (m *termManager) handleList(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	ts := make([]*terminal, 0, len(m.terms))
	for _, t := range m.terms {
		if t != nil {
			ts = append(ts, t)
		}
	}
	m.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
	list := guest.TermList{Terminals: make([]guest.TermInfo, 0, len(ts))}
	for _, t := range ts {
		list.Terminals = append(list.Terminals, t.info())
	}
	writeJSON(w, list)
}

func (m *termManager) handleGet(w http.ResponseWriter, r *http.Request) {
	if t := m.lookup(w, r); t != nil {
		writeJSON(w, t.info())
	}
}

func (m *termManager) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req guest.TermCreate
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad terminal JSON: "+err.Error())
		return
	}
	if req.Name != "" && !validTermName(req.Name) {
		writeError(w, http.StatusBadRequest, "invalid", "invalid terminal name "+strconv.Quote(req.Name)+" (want [A-Za-z0-9._-]{1,64})")
		return
	}
	if req.Cols == 0 {
		req.Cols = termDefaultCols
	}
	if req.Rows == 0 {
		req.Rows = termDefaultRows
	}
	if err := checkSize(req.Cols, req.Rows); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	u, err := m.a.users.lookup(req.User)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	argv, login := req.Argv, false
	if len(argv) == 0 {
		argv, login = []string{u.Shell}, true
	}
	env := make(map[string]string, len(req.Env)+1)
	for k, v := range req.Env {
		env[k] = v
	}
	if _, ok := env["TERM"]; !ok {
		env["TERM"] = termDefaultTERM
	}
	sp, err := m.a.prepareExec(&guest.ExecRequest{Argv: argv, Env: env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if sp.lookErr != nil {
		writeError(w, http.StatusBadRequest, "invalid", sp.lookErr.Error())
		return
	}
	if login {
		sp.argv = []string{"-" + filepath.Base(sp.argv[0])}
	}

	m.mu.Lock()
	name := req.Name
	if name == "" {
		for {
			m.seq++
			name = "t" + strconv.Itoa(m.seq)
			if _, ok := m.terms[name]; !ok {
				break
			}
		}
	} else if _, ok := m.terms[name]; ok {
		m.mu.Unlock()
		writeError(w, http.StatusConflict, "exists", "terminal "+strconv.Quote(name)+" exists")
		return
	}
	m.terms[name] = nil // reserved
	m.mu.Unlock()

	t, err := startTerminal(m, name, u.Name, sp, req.Cols, req.Rows, req.Ephemeral)
	m.mu.Lock()
	if err != nil {
		delete(m.terms, name)
	} else {
		m.terms[name] = t
	}
	m.mu.Unlock()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	info := t.info()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(info)
}

func (m *termManager) handleDelete(w http.ResponseWriter, r *http.Request) {
	t := m.lookup(w, r)
	if t == nil {
		return
	}
	if m.remove(t) {
		t.shutdown()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (m *termManager) handleResize(w http.ResponseWriter, r *http.Request) {
	t := m.lookup(w, r)
	if t == nil {
		return
	}
	var sz guest.TermSize
	if err := decodeBody(w, r, &sz); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad size JSON: "+err.Error())
		return
	}
	if err := checkSize(sz.Cols, sz.Rows); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if err := t.resize(sz.Cols, sz.Rows); err != nil {
		writeError(w, http.StatusConflict, "closed", "resize: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (m *termManager) handleSignal(w http.ResponseWriter, r *http.Request) {
	t := m.lookup(w, r)
	if t == nil {
		return
	}
	sig, ok := readSignal(w, r)
	if !ok {
		return
	}
	t.signal(sig)
	w.WriteHeader(http.StatusNoContent)
}

// readSignal decodes a guest.TermSignal body and parses its signal
// (guest.ParseSignal), answering 400 itself when either is bad.
func readSignal(w http.ResponseWriter, r *http.Request) (syscall.Signal, bool) {
	var req guest.TermSignal
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad signal JSON: "+err.Error())
		return 0, false
	}
	sig, err := guest.ParseSignal(req.Signal)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return 0, false
	}
	return sig, true
}

func (m *termManager) handleAttach(w http.ResponseWriter, r *http.Request) {
	t := m.lookup(w, r)
	if t == nil {
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.TermUpgrade) {
		writeError(w, http.StatusBadRequest, "invalid", "attach needs Upgrade: "+guest.TermUpgrade)
		return
	}
	var att guest.TermAttach
	if err := decodeBody(w, r, &att); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad attach JSON: "+err.Error())
		return
	}
	if att.Cols > 0 && att.Rows > 0 {
		if err := checkSize(att.Cols, att.Rows); err != nil {
			writeError(w, http.StatusBadRequest, "invalid", err.Error())
			return
		}
	}
	if t.isClosing() {
		writeError(w, http.StatusNotFound, "not_found", "terminal "+strconv.Quote(t.name)+" is closing")
		return
	}
	conn, br, ok := hijack(w)
	if !ok {
		return
	}
	t.serveClient(conn, br, att)
}
