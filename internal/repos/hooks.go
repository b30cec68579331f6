package repos

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// SignatureHeader carries a webhook's signature: "sha256=" and the hex
// HMAC-SHA256 of the body under the hook's secret.
const SignatureHeader = "X-Agentvm-Signature"

// hookAttempts and hookBackoff: a delivery is tried up to 6 times, waiting
// 1, 2, 4, 8 and 16 s between tries; each try has hookTimeout.
const hookAttempts = 6

// Variables for the tests.
var (
	hookBackoff = time.Second
	hookTimeout = 10 * time.Second
)

// maxHooks bounds a repository's webhooks.
const maxHooks = 20

// Sign is the signature of body under secret, as SignatureHeader carries it.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// AddHook adds a webhook to a repository; the answer holds its secret.
func (s *Service) AddHook(ctx context.Context, name string, req api.AddRepoHookRequest) (*api.RepoHook, error) {
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(req.URL) > 2000 {
		return nil, fmt.Errorf("%w: hook url %q: an http:// or https:// URL", ErrInvalid, req.URL)
	}
	rec, err := s.record(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(rec.Hooks) >= maxHooks {
		return nil, fmt.Errorf("%w: repository %s already has %d webhooks", ErrInvalid, name, maxHooks)
	}
	id, secret := make([]byte, 6), make([]byte, 24)
	rand.Read(id)
	rand.Read(secret)
	h := store.RepoHook{ID: "hook_" + hex.EncodeToString(id), URL: req.URL, Secret: hex.EncodeToString(secret),
		AllowPrivate: req.AllowPrivate, CreatedAt: time.Now().UTC()}
	rec.Hooks = append(rec.Hooks, h)
	if err := s.cfg.Store.UpdateRepo(ctx, rec); err != nil {
		return nil, err
	}
	return &api.RepoHook{ID: h.ID, URL: h.URL, Secret: h.Secret, AllowPrivate: h.AllowPrivate, CreatedAt: h.CreatedAt}, nil
}

// RemoveHook removes a webhook; deliveries under way finish.
func (s *Service) RemoveHook(ctx context.Context, name, id string) error {
	rec, err := s.record(ctx, name)
	if err != nil {
		return err
	}
	for i, h := range rec.Hooks {
		if h.ID == id {
			rec.Hooks = append(rec.Hooks[:i], rec.Hooks[i+1:]...)
			return s.cfg.Store.UpdateRepo(ctx, rec)
		}
	}
	return fmt.Errorf("%w: repository %s has no webhook %q", ErrNotFound, name, id)
}

// hookSender delivers webhooks in the background, each with retries.
type hookSender struct {
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{} // bounds the deliveries under way

	mu      sync.Mutex
	closed  bool
	perRepo map[string]int // deliveries under way per repository
}

// maxRepoDeliveries bounds one repository's deliveries under way, so that a
// repository pushed in a loop to a hook that hangs does not take the
// others' turns.
const maxRepoDeliveries = 8

func newHookSender(log *slog.Logger) *hookSender {
	ctx, cancel := context.WithCancel(context.Background())
	return &hookSender{log: log, ctx: ctx, cancel: cancel, sem: make(chan struct{}, 64), perRepo: map[string]int{}}
}

func (h *hookSender) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// take reserves a delivery's turn for repo (false: none free, or closed).
func (h *hookSender) take(repo string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.perRepo[repo] >= maxRepoDeliveries {
		return false
	}
	select {
	case h.sem <- struct{}{}:
	default:
		return false
	}
	h.perRepo[repo]++
	h.wg.Add(1)
	return true
}

func (h *hookSender) give(repo string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	<-h.sem
	if h.perRepo[repo]--; h.perRepo[repo] <= 0 {
		delete(h.perRepo, repo)
	}
	h.wg.Done()
}

// send posts push to each hook; event records the outcome on the
// repository's log.
func (h *hookSender) send(repo string, hooks []store.RepoHook, push api.RepoPush, event func(string, string, string, map[string]string, string, ...any)) {
	body, _ := json.Marshal(push)
	for _, hk := range hooks {
		if !h.take(repo) {
			event("repo:"+repo, "webhook", "system", map[string]string{"hook": hk.ID}, "webhook %s dropped: too many deliveries under way, or the daemon is stopping", hk.ID)
			continue
		}
		go func() {
			defer h.give(repo)
			err := h.deliver(hk, body)
			data := map[string]string{"hook": hk.ID, "url": hk.URL}
			if err != nil {
				data["error"] = err.Error()
				event("repo:"+repo, "webhook", "system", data, "webhook %s to %s failed: %v", hk.ID, hk.URL, err)
				return
			}
			event("repo:"+repo, "webhook", "system", data, "webhook %s delivered to %s", hk.ID, hk.URL)
		}()
	}
}

// deliver posts body to the hook until it answers 2xx, backing off.
func (h *hookSender) deliver(hk store.RepoHook, body []byte) error {
	client := hookClient(hk.AllowPrivate)
	wait := hookBackoff
	var err error
	for attempt := 1; attempt <= hookAttempts; attempt++ {
		if err = h.post(client, hk, body, attempt); err == nil {
			return nil
		}
		h.log.Info("webhook delivery failed", "hook", hk.ID, "url", hk.URL, "attempt", attempt, "err", err)
		if attempt == hookAttempts {
			break
		}
		select {
		case <-time.After(wait):
		case <-h.ctx.Done():
			return fmt.Errorf("%w (the daemon stopped)", err)
		}
		wait *= 2
	}
	return fmt.Errorf("%d attempts, the last: %w", hookAttempts, err)
}

func (h *hookSender) post(client *http.Client, hk store.RepoHook, body []byte, attempt int) error {
	ctx, cancel := context.WithTimeout(h.ctx, hookTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hk.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentvm-webhook")
	req.Header.Set("X-Agentvm-Event", "push")
	req.Header.Set("X-Agentvm-Hook", hk.ID)
	req.Header.Set("X-Agentvm-Delivery-Attempt", strconv.Itoa(attempt))
	req.Header.Set(SignatureHeader, Sign(hk.Secret, body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

// hookClient is an HTTP client that follows no redirect and, unless
// allowPrivate, dials no loopback, private or link-local address (checked
// on the address it connects to, so a name that resolves there is caught).
func hookClient(allowPrivate bool) *http.Client {
	d := &net.Dialer{Timeout: hookTimeout}
	if !allowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if forbidden(ap.Addr()) {
				return fmt.Errorf("refused to reach %s: a loopback, private or link-local address (add the hook with allow_private to allow it)", ap.Addr())
			}
			return nil
		}
	}
	return &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, Proxy: nil, TLSHandshakeTimeout: hookTimeout, DisableKeepAlives: true},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			return fmt.Errorf("the hook redirected to %s: webhooks follow no redirects", req.URL.Redacted())
		},
	}
}
