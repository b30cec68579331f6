// Package e2b makes agentvm speak E2B's APIs: the control plane (sandboxes,
// snapshots, forks) on the API listener and envd (processes, files,
// watches) behind the preview proxy, both translated to vm and guest calls,
// so that the unmodified e2b SDKs drive agentvm VMs.
package e2b

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/record"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// EnvdPort is the port envd answers on in a sandbox's preview hosts.
const EnvdPort = 49983

// EnvdVersion is the envd version agentvm reports: the SDKs enable their
// features by it (0.6.4 turns on everything up to upload metadata, watch
// entries and network-mount watches).
const EnvdVersion = "0.6.4"

// DefaultUser is the user envd calls run as when the caller names none:
// the base image's default user.
const DefaultUser = "user"

// VMs is what the E2B layer needs from the VM service.
type VMs interface {
	Get(ctx context.Context, idOrName string) (*store.VM, error)
	// GetFresh is Get from the database, not the read cache: for what
	// decides a sandbox's fate (vm.Service.GetFresh).
	GetFresh(ctx context.Context, idOrName string) (*store.VM, error)
	Create(ctx context.Context, o vm.CreateOptions) (*store.VM, bool, error)
	CreateFrom(ctx context.Context, snap string, o vm.CreateOptions) (*store.VM, bool, error)
	Delete(ctx context.Context, idOrName string) error
	Suspend(ctx context.Context, idOrName string) (*vm.OpResult, error)
	Wake(ctx context.Context, idOrName string) (*store.VM, error)
	Stop(ctx context.Context, idOrName string) (*store.VM, error)
	Start(ctx context.Context, idOrName string) (*store.VM, error)
	Snapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error)
	Snapshots(ctx context.Context) ([]*store.Snapshot, error)
	GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, idOrName string) error
	ForkWith(ctx context.Context, idOrName string, o vm.ForkOptions) (*vm.ForkResult, error)
	Guest(ctx context.Context, idOrName string) (*store.VM, *guest.Client, error)
	Hold(id string) func()
	// Event records what happened to a VM, and who did it.
	Event(vmID, typ, actor, format string, args ...any)
}

// Config configures the E2B layer.
type Config struct {
	VMs    VMs
	Store  *store.Store
	Tokens *auth.Service
	// Domain is what sandboxes report as their domain: the preview
	// domain with the proxy's port, e.g. localhost:7080, so that the SDK's
	// getHost(port) names a working preview host.
	Domain string
	// Key signs envd access tokens (HMAC of the VM id and the id of the
	// API key they were given to, envdtoken.go): stable across restarts,
	// never stored.
	Key []byte
	// Forward, when set, may pass a request about sandbox v, made by p,
	// to the cluster node that runs it, and reports whether it did.
	Forward func(w http.ResponseWriter, r *http.Request, p *auth.Principal, v *store.VM) bool
	Log     *slog.Logger
	// Record, when set, records the processes started through envd as
	// execs (docs/recordings.md).
	Record *record.Store
}

type callerKey struct{}

// WithCaller marks a request another cluster node forwarded for caller p
// (Config.Forward there): the control plane serves it as p, without an
// X-API-KEY.
func WithCaller(ctx context.Context, p *auth.Principal) context.Context {
	return context.WithValue(ctx, callerKey{}, p)
}

// Server serves both E2B APIs.
type Server struct {
	cfg Config
	log *slog.Logger

	mu            sync.Mutex
	watchers      map[string]*watcher // CreateWatcher's polling watches
	watcherCreate sync.Mutex
	lives         lives // lifecycle.go

	tpl      Templates      // template builds (nil: off)
	filesDir string         // the COPY uploads of the Template SDK
	builds   templateBuilds // the SDK's builds, requested to ended (templates.go)
}

// New makes the E2B layer.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Log, watchers: map[string]*watcher{}}
}

// SetDomain sets the domain sandboxes report (known once the proxy listens).
func (s *Server) SetDomain(d string) { s.cfg.Domain = d }

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newSandboxID is a VM name that is also an E2B sandbox id: lowercase
// letters and digits only (the SDKs and their users split "<port>-<id>").
func newSandboxID() string {
	b := make([]byte, 20)
	rand.Read(b)
	out := make([]byte, len(b))
	out[0] = 'i' // a letter first, like E2B's ids
	for i := 1; i < len(b); i++ {
		out[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(out)
}

// Forget drops what the E2B layer keeps about a deleted VM.
func (s *Server) Forget(vmID string) {
	s.cfg.Store.DeleteSandbox(context.Background(), vmID)
	s.lives.forget(vmID)
	s.mu.Lock()
	for id, w := range s.watchers {
		if w.vmID == vmID {
			w.stop()
			delete(s.watchers, id)
		}
	}
	s.mu.Unlock()
}

// Run enforces sandbox timeouts until ctx ends: a sandbox whose end time
// has passed is deleted, or suspended when it was created with autoPause.
// Up to expirers sandboxes are handled at once, each by one goroutine: a
// slow suspend or shutdown does not hold up the others' ends.
func (s *Server) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	f := newFanout(expirers)
	defer f.wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sbs, err := s.cfg.Store.ListSandboxes(ctx)
		if err != nil {
			continue
		}
		now := time.Now()
		for _, sb := range sbs {
			if sb.EndAt.IsZero() || sb.EndAt.After(now) {
				continue
			}
			if !f.try(sb.VMID, func() { s.expire(ctx, sb) }) && f.full() {
				break // the rest at the next tick
			}
		}
	}
}

// expirers is how many sandbox timeouts Run applies at once.
const expirers = 4

// fanout runs functions by key, at most n at once and one per key.
type fanout struct {
	mu    sync.Mutex
	n     int
	keys  map[string]bool
	group sync.WaitGroup
}

func newFanout(n int) *fanout { return &fanout{n: n, keys: map[string]bool{}} }

// try starts fn for key in a goroutine, unless one runs for key already or
// n run; it reports whether it started fn.
func (f *fanout) try(key string, fn func()) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys[key] || len(f.keys) >= f.n {
		return false
	}
	f.keys[key] = true
	f.group.Add(1)
	go func() {
		defer f.group.Done()
		defer func() {
			f.mu.Lock()
			delete(f.keys, key)
			f.mu.Unlock()
		}()
		fn()
	}()
	return true
}

// full reports whether n functions run.
func (f *fanout) full() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys) >= f.n
}

// wait waits for every function started.
func (f *fanout) wait() { f.group.Wait() }

// writeJSON answers with a JSON body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		_ = jsonEncode(w, v)
	}
}
