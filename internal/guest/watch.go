package guest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
)

// WatchStream is an open directory watch.
type WatchStream struct {
	*ndjson
	c      *Client
	syncID string // names the watch to PathWatchSync

	mu    sync.Mutex
	marks map[string]chan struct{} // Sync's marks not yet seen, by name
}

// WatchDir opens a watch on the directory path as user (see PathWatch); it
// returns once the watch is in place.
func (c *Client) WatchDir(ctx context.Context, path, user string, recursive bool) (*WatchStream, error) {
	syncID := randomHex(12)
	q := url.Values{"path": {path}, "user": {user}, "recursive": {strconv.FormatBool(recursive)}, "sync": {syncID}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+PathWatch+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guest: watch: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	s := &WatchStream{ndjson: newNDJSON(resp.Body), c: c, syncID: syncID, marks: map[string]chan struct{}{}}
	var ev WatchEvent
	err = s.next(&ev)
	if err == nil && ev.Op != WatchStart {
		err = fmt.Errorf("guest: watch: unexpected first event %q", ev.Op)
	}
	if err != nil {
		resp.Body.Close()
		return nil, err
	}
	return s, nil
}

// Next returns the next change; an "error" event is returned as an error.
// Sync's marks are not changes: Next passes them to Sync and reads on.
func (s *WatchStream) Next() (WatchEvent, error) {
	for {
		var ev WatchEvent
		if err := s.next(&ev); err != nil {
			return ev, err
		}
		switch ev.Op {
		case WatchError:
			return ev, errors.New("guest: watch: " + ev.Name)
		case WatchSync:
			s.mu.Lock()
			if ch := s.marks[ev.Name]; ch != nil {
				close(ch)
				delete(s.marks, ev.Name)
			}
			s.mu.Unlock()
			continue
		}
		return ev, nil
	}
}

// Sync returns once Next has returned every change the agent's watch had
// seen when Sync was called (say, of a write the caller just made), and
// read past them: the agent puts a mark in the watch's own event queue,
// behind them. Someone must be calling Next meanwhile. An agent from
// before watch syncs answers an *APIError of status 404.
func (s *WatchStream) Sync(ctx context.Context) error {
	mark := randomHex(12)
	seen := make(chan struct{})
	s.mu.Lock()
	s.marks[mark] = seen
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.marks, mark)
		s.mu.Unlock()
	}()
	q := url.Values{"id": {s.syncID}, "mark": {mark}}
	if err := s.c.do(ctx, http.MethodPost, PathWatchSync+"?"+q.Encode(), nil, nil); err != nil {
		return err
	}
	select {
	case <-seen:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("guest: watch sync: %w", ctx.Err())
	}
}

// Close ends the watch.
func (s *WatchStream) Close() error { return s.body.Close() }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
