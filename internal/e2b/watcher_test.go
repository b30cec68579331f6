package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/guest/guesttest"
	"github.com/agentvm/agentvm/internal/store"
)

// A polled watcher's events are queued as they arrive, without a stat per
// event in between, and a poll gives them their entries: the SDK polls
// right after its write and expects the WRITE there, entry and all.
func TestPolledWatcherEntries(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	release := make(chan struct{})
	stats := make(chan string, 10)
	agent := http.NewServeMux()
	agent.HandleFunc("POST "+guest.PathWatch, func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for _, ev := range []guest.WatchEvent{{Op: guest.WatchStart}, {Op: guest.WatchCreate, Name: "a.txt"},
			{Op: guest.WatchWrite, Name: "a.txt"}, {Op: guest.WatchRemove, Name: "b.txt"}} {
			enc.Encode(ev)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	agent.HandleFunc("GET "+guest.PathFilesStat, func(w http.ResponseWriter, r *http.Request) {
		stats <- r.URL.Query().Get("path")
		<-release // a stat in the event path would hold the events back
		json.NewEncoder(w).Encode(api.FileInfo{Name: "a.txt", Path: r.URL.Query().Get("path"), Size: 3})
	})
	s := New(Config{Store: st, Key: []byte("key")})
	c := &envdCall{s: s, vm: &store.VM{ID: "vm1"}, p: auth.Admin, user: "user", g: guesttest.Agent(t, agent)}
	ctx := context.Background()
	cw, err := c.createWatcher(ctx, &watchRequest{Path: "/home/user/d", IncludeEntry: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.removeWatcher(ctx, &watcherIDRequest{WatcherID: cw.WatcherID})
	w, _ := c.watcher(cw.WatcherID)
	deadline := time.Now().Add(time.Minute)
	for {
		w.mu.Lock()
		n := len(w.events)
		w.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events queued, want 3 (a stat held them back?)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(stats) != 0 {
		t.Fatalf("an event was stat-ed before a poll: %s", <-stats)
	}
	close(release)
	got, err := c.getWatcherEvents(ctx, &watcherIDRequest{WatcherID: cw.WatcherID})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Events) != 3 || got.Events[1].Type != eventWrite || got.Events[1].Entry == nil ||
		got.Events[1].Entry.Path != "/home/user/d/a.txt" || got.Events[0].Entry != got.Events[1].Entry || got.Events[2].Entry != nil {
		t.Fatalf("events %+v", got.Events)
	}
	if n := len(stats); n != 1 {
		t.Fatalf("%d stats for the events of one path, want 1", n)
	}
}
