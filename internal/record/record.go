// Package record keeps what was typed and seen in a VM: every terminal
// session as an asciicast v2 file (it plays in `asciinema play`), every
// exec as a line of JSON (argv, user, cwd, stdin size, output, exit,
// duration). They are written by the daemon from what its relays carry,
// never by the guest, under <data dir>/recordings/<vm id>/, bounded per VM
// (the oldest go first) and kept for a retention period.
package record

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxPerVM  = 64 << 20
	DefaultRetention = 30 * 24 * time.Hour
)

// ErrNotFound is an unknown recording.
var ErrNotFound = errors.New("not found")

// Config configures a Store.
type Config struct {
	Dir       string        // <data dir>/recordings
	MaxPerVM  int64         // bytes per VM, 0: DefaultMaxPerVM
	Retention time.Duration // 0: DefaultRetention
	Log       *slog.Logger
	// Evicted, when set, is told that a VM's oldest recordings were
	// removed to make room (n of them, the oldest begun at first): the
	// VM's event log keeps the fact, since a guest could try to push its
	// history out this way.
	Evicted func(vmID string, n int, first time.Time)
}

// Store keeps the recordings of every VM.
type Store struct {
	cfg Config

	mu   sync.Mutex
	used map[string]int64 // VM id -> bytes its recordings hold (loaded on first use)
}

// New returns a store; Dir is made on first use.
func New(cfg Config) *Store {
	if cfg.MaxPerVM <= 0 {
		cfg.MaxPerVM = DefaultMaxPerVM
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Store{cfg: cfg, used: map[string]int64{}}
}

// offFile marks a VM whose sessions are not recorded.
const offFile = ".off"

var vmIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (s *Store) vmDir(vmID string) (string, error) {
	if !vmIDRE.MatchString(vmID) {
		return "", fmt.Errorf("bad VM id %q", vmID)
	}
	return filepath.Join(s.cfg.Dir, vmID), nil
}

// SetEnabled turns a VM's recording on or off (on by default).
func (s *Store) SetEnabled(vmID string, on bool) error {
	dir, err := s.vmDir(vmID)
	if err != nil {
		return err
	}
	if on {
		err := os.Remove(filepath.Join(dir, offFile))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, offFile), nil, 0o600)
}

// Enabled reports whether the VM's sessions are recorded (never by a nil
// Store: a daemon without recordings).
func (s *Store) Enabled(vmID string) bool {
	if s == nil {
		return false
	}
	dir, err := s.vmDir(vmID)
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, offFile))
	return errors.Is(err, fs.ErrNotExist)
}

// Forget removes a deleted VM's recordings.
func (s *Store) Forget(vmID string) {
	if s == nil {
		return
	}
	dir, err := s.vmDir(vmID)
	if err != nil {
		return
	}
	s.mu.Lock()
	delete(s.used, vmID)
	s.mu.Unlock()
	os.RemoveAll(dir)
}

// newID names a recording: its start time and a random suffix, so that
// names sort by time.
func newID(kind string, t time.Time) string {
	b := make([]byte, 3)
	rand.Read(b)
	return kind + "-" + t.UTC().Format("20060102T150405.000000000") + "-" + hex.EncodeToString(b)
}

var idRE = regexp.MustCompile(`^(term|exec)-[0-9T.]+-[0-9a-f]{6}$`)

// reserve accounts n more bytes to the VM vmID; past the bound it removes
// the VM's oldest recordings (never keep's) and reports whether the bytes
// now fit.
func (s *Store) reserve(vmID, keep string, n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	used, ok := s.used[vmID]
	if !ok {
		used = s.sizeOf(vmID)
	}
	used += n
	if used > s.cfg.MaxPerVM {
		used = s.evict(vmID, keep, used)
	}
	s.used[vmID] = used
	if used > s.cfg.MaxPerVM {
		s.used[vmID] = used - n
		return false
	}
	return true
}

func (s *Store) sizeOf(vmID string) int64 {
	var n int64
	dir, _ := s.vmDir(vmID)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// evict removes the VM's oldest recordings until used fits (or only keep
// is left) and returns what is used then.
func (s *Store) evict(vmID, keep string, used int64) int64 {
	dir, _ := s.vmDir(vmID)
	ents, _ := os.ReadDir(dir)
	sort.Slice(ents, func(i, j int) bool { return stemTime(ents[i].Name()) < stemTime(ents[j].Name()) })
	n, first := 0, time.Time{}
	defer func() {
		if n > 0 && s.cfg.Evicted != nil {
			go s.cfg.Evicted(vmID, n, first) // not under the store's lock
		}
	}()
	for _, e := range ents {
		if used <= s.cfg.MaxPerVM {
			break
		}
		stem := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".cast"), ".jsonl")
		if stem == keep || !idRE.MatchString(stem) {
			continue
		}
		if fi, err := e.Info(); err == nil && os.Remove(filepath.Join(dir, e.Name())) == nil {
			used -= fi.Size()
			if n == 0 {
				first, _ = time.Parse("20060102T150405.000000000", strings.SplitN(stemTime(e.Name()), "-", 2)[0])
			}
			n++
		}
	}
	return used
}

// stemTime is the time part of a recording's name, for sorting.
func stemTime(name string) string {
	_, rest, _ := strings.Cut(name, "-")
	return rest
}

// Prune removes the recordings older than the retention period.
func (s *Store) Prune(now time.Time) {
	vms, _ := os.ReadDir(s.cfg.Dir)
	for _, v := range vms {
		if !v.IsDir() {
			continue
		}
		dir := filepath.Join(s.cfg.Dir, v.Name())
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			fi, err := e.Info()
			if err == nil && e.Name() != offFile && now.Sub(fi.ModTime()) > s.cfg.Retention {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
		s.mu.Lock()
		delete(s.used, v.Name())
		s.mu.Unlock()
	}
}

// Info describes a recording.
type Info struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"` // terminal or exec
	Title      string    `json:"title"`
	User       string    `json:"user,omitempty"`
	Actor      string    `json:"actor,omitempty"`
	Start      time.Time `json:"start"`
	DurationMs int64     `json:"duration_ms"`
	Bytes      int64     `json:"bytes"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Cut        bool      `json:"cut,omitempty"` // stopped at the VM's bound
}

// List describes the VM's recordings, oldest first.
func (s *Store) List(vmID string) ([]Info, error) {
	dir, err := s.vmDir(vmID)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Info{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".cast") && idRE.MatchString(strings.TrimSuffix(name, ".cast")):
			if in, err := castInfo(filepath.Join(dir, name)); err == nil {
				out = append(out, in)
			}
		case strings.HasSuffix(name, ".jsonl") && idRE.MatchString(strings.TrimSuffix(name, ".jsonl")):
			if in, err := execInfo(filepath.Join(dir, name)); err == nil {
				out = append(out, in)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out, nil
}

// Open opens one recording (an asciicast file, or an exec's JSON line)
// and says which kind it is.
func (s *Store) Open(vmID, id string) (io.ReadCloser, string, error) {
	dir, err := s.vmDir(vmID)
	if err != nil || !idRE.MatchString(id) {
		return nil, "", fmt.Errorf("%w: no recording %q", ErrNotFound, id)
	}
	kind, ext := "terminal", ".cast"
	if strings.HasPrefix(id, "exec-") {
		kind, ext = "exec", ".jsonl"
	}
	f, err := os.Open(filepath.Join(dir, id+ext))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: VM has no recording %q", ErrNotFound, id)
	}
	return f, kind, err
}

// castInfo reads a cast's header and the time of its last event.
func castInfo(path string) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	fi, _ := f.Stat()
	br := bufio.NewReaderSize(f, 64<<10)
	line, err := br.ReadString('\n')
	if err != nil && line == "" {
		return Info{}, err
	}
	var h castHeader
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		return Info{}, err
	}
	in := Info{ID: strings.TrimSuffix(filepath.Base(path), ".cast"), Kind: "terminal", Title: h.Title, User: h.User, Actor: h.Actor,
		Start: time.Unix(h.Timestamp, 0).UTC(), Bytes: fi.Size()}
	// The last event's time: read the file's end.
	var tail [4096]byte
	off := max(fi.Size()-int64(len(tail)), 0)
	n, _ := f.ReadAt(tail[:], off)
	lines := strings.Split(strings.TrimSpace(string(tail[:n])), "\n")
	var ev []json.RawMessage
	if json.Unmarshal([]byte(lines[len(lines)-1]), &ev) == nil && len(ev) == 3 {
		var t float64
		var typ, data string
		json.Unmarshal(ev[0], &t)
		json.Unmarshal(ev[1], &typ)
		json.Unmarshal(ev[2], &data)
		in.DurationMs = int64(t * 1000)
		in.Cut = typ == "m" && strings.HasPrefix(data, cutMarker)
	}
	return in, nil
}

func execInfo(path string) (Info, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Info{}, err
	}
	var e Exec
	if err := json.Unmarshal(b, &e); err != nil {
		return Info{}, err
	}
	code := e.ExitCode
	return Info{ID: e.ID, Kind: "exec", Title: e.Command, User: e.User, Actor: e.Actor, Start: e.Start,
		DurationMs: e.DurationMs, Bytes: int64(len(b)), ExitCode: &code, Cut: e.StdoutTruncated || e.StderrTruncated}, nil
}
