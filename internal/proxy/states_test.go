package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// stateVMs is one VM ("web", vm1) in a chosen state. DialPort does what the
// VM service does: a paused or suspended VM is woken first (recorded), a
// running one is dialled, others fail as the service fails them.
type stateVMs struct {
	mu      sync.Mutex
	state   store.State
	backend string
	dialErr error // returned by DialPort instead of a connection
	refuse  int   // the next dials that find nothing listening
	woken   int
	dials   int
}

func (f *stateVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ref != "web" && ref != "vm1" {
		return nil, fmt.Errorf("%w: no VM %q", vm.ErrNotFound, ref)
	}
	return &store.VM{ID: "vm1", Name: "web", State: f.state, StartedAt: &stateVMsStarted}, nil
}

var stateVMsStarted = time.Unix(1_800_000_000, 0)

func (f *stateVMs) DialPort(ctx context.Context, _ string, _ int) (net.Conn, error) {
	f.mu.Lock()
	f.dials++
	switch f.state {
	case store.StatePaused, store.StateSuspended:
		f.state = store.StateRunning
		f.woken++
	}
	st, err := f.state, f.dialErr
	if f.refuse > 0 && st == store.StateRunning {
		f.refuse--
		err = fmt.Errorf("%w: %w: connect to port 3000: connection refused", vm.ErrUnavailable, vm.ErrNoListener)
	}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if st != store.StateRunning {
		return nil, fmt.Errorf("%w: cannot exec VM web: it is %s", vm.ErrConflict, st)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.backend)
}

func (*stateVMs) Hold(string) func() { return func() {} }

// A preview of a VM in each state: running, paused and suspended VMs
// answer (the last two woken by the request), the others get a page
// naming their state without any dial; errors of the dial become the
// statuses a browser should see.
func TestPreviewInEveryState(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the VM") }))
	defer backend.Close()
	backend.Config.SetKeepAlivesEnabled(false) // every request dials the VM again
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	as := auth.New(st, "avm_admin")
	f := &stateVMs{backend: backend.Listener.Addr().String()}
	p, err := New(Config{Listen: "127.0.0.1:0", Domain: "localhost", Auth: as, Store: st, VMs: f})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	get := func() (int, string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = "3000-web.localhost"
		r.Header.Set("Authorization", "Bearer avm_admin")
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	for _, st := range []store.State{store.StateRunning, store.StatePaused, store.StateSuspended} {
		f.state, f.woken = st, 0
		code, body := get()
		if code != http.StatusOK || body != "from the VM" {
			t.Errorf("%s: %d %q", st, code, body)
		}
		if want := map[bool]int{true: 1, false: 0}[st != store.StateRunning]; f.woken != want {
			t.Errorf("%s: woken %d times", st, f.woken)
		}
	}
	for _, st := range []store.State{store.StateStopped, store.StateCrashed, store.StateError, store.StateCreating, store.StateDeleting} {
		f.state, f.dials = st, 0
		code, body := get()
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "web is "+string(st)) || f.dials != 0 {
			t.Errorf("%s: %d %q after %d dials", st, code, body, f.dials)
		}
	}
	f.state = store.StateRunning
	for _, c := range []struct {
		err  error
		code int
		says string
	}{
		{fmt.Errorf("%w: %w: connect to port 3000: connection refused", vm.ErrUnavailable, vm.ErrNoListener), http.StatusBadGateway, "nothing is listening on port 3000"},
		{fmt.Errorf("%w: cannot wake web: it is being deleted", vm.ErrConflict), http.StatusServiceUnavailable, "VM not running"},
		{fmt.Errorf("%w: %w: reset", vm.ErrUnavailable, vm.ErrGuestDial), http.StatusBadGateway, "Bad gateway"},
	} {
		f.dialErr = c.err
		if code, body := get(); code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("dial error %v: %d %q", c.err, code, body)
		}
	}
}

// DialGuest: the VM's ports listen on its address.
func (f *stateVMs) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	return f.DialPort(ctx, id, port)
}

// A request that wakes its VM waits a moment for a server that listens
// only after the wake (one paused in the middle of its start): its dial
// retries "nothing listens"; a request to a running VM does not.
func TestPreviewWaitsForAServerAfterAWake(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the VM") }))
	defer backend.Close()
	backend.Config.SetKeepAlivesEnabled(false)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := &stateVMs{backend: backend.Listener.Addr().String()}
	p, err := New(Config{Listen: "127.0.0.1:0", Domain: "localhost", Auth: auth.New(st, "avm_admin"), Store: st, VMs: f})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, c := range []struct {
		state store.State
		code  int
		dials int
	}{
		{store.StateSuspended, http.StatusOK, 4},
		{store.StatePaused, http.StatusOK, 4},
		{store.StateRunning, http.StatusBadGateway, 1},
	} {
		f.mu.Lock()
		f.state, f.refuse, f.dials = c.state, 3, 0
		f.mu.Unlock()
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = "3000-web.localhost"
		r.Header.Set("Authorization", "Bearer avm_admin")
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		f.mu.Lock()
		dials := f.dials
		f.mu.Unlock()
		if rec.Code != c.code || dials != c.dials {
			t.Errorf("%s, the server listening after 3 refused dials: %d after %d dials, want %d after %d", c.state, rec.Code, dials, c.code, c.dials)
		}
	}
}

// restartingCompat owns every VM, and its Reach finds each one's machine
// new (started) or not, as E2B's does for a sandbox its timeout was
// pausing: recorded running, then woken once the suspend is done.
type restartingCompat struct {
	fakeCompat
	restart bool
}

func (c restartingCompat) Reach(_ context.Context, v *store.VM) (*store.VM, bool) {
	w := *v
	if c.restart {
		now := time.Now()
		w.StartedAt = &now
	}
	return &w, true
}

// A compatibility-layer request whose VM was recorded running but woken by
// its Reach (a timeout's suspend under way) waits for a listener as after
// any wake; one whose machine Reach did not change does not.
func TestCompatWaitsForAServerAfterAWake(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the VM") }))
	defer backend.Close()
	backend.Config.SetKeepAlivesEnabled(false)
	for _, restart := range []bool{true, false} {
		f := &stateVMs{backend: backend.Listener.Addr().String(), state: store.StateRunning, refuse: 3}
		p, _ := newProxyOn(t, f, restartingCompat{restart: restart})
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = "3000-web.localhost"
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		f.mu.Lock()
		dials := f.dials
		f.mu.Unlock()
		want, wantDials := http.StatusOK, 4
		if !restart {
			want, wantDials = http.StatusBadGateway, 1
		}
		if rec.Code != want || dials != wantDials {
			t.Errorf("machine restarted by Reach %v: %d after %d dials, want %d after %d", restart, rec.Code, dials, want, wantDials)
		}
	}
}
