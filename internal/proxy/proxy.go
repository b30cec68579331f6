// Package proxy is the preview URL router: http://<port>-<vm>.<domain>/
// (and custom domains mapped through the API) reach that port inside the
// VM, with HTTP/1.1, h2c, WebSocket upgrades and streaming responses passed
// through unbuffered. It also runs the raw TCP exposures (tcp.go).
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// VMs is what the proxy needs from the VM service.
type VMs interface {
	Get(ctx context.Context, idOrName string) (*store.VM, error)
	// DialPort connects to a TCP port inside a VM, waking it first: on
	// its network address, or else on the guest's loopback (loopback.go).
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
	// DialGuest connects to a TCP port on the VM's network address only,
	// waking it first; vm.ErrNoListener when nothing listens there.
	DialGuest(ctx context.Context, id string, port int) (net.Conn, error)
	// Hold marks the VM in use until the returned func is called (idle policy).
	Hold(id string) func()
}

// Compat is a compatibility layer (internal/e2b) that owns some VMs'
// previews: their ports are public, their errors are its own, and one port
// of theirs (CompatPort) it serves itself.
type Compat interface {
	// Route names the VM and port of a request whose Host is not a preview
	// host, from the layer's own headers.
	Route(r *http.Request) (ref string, port int, ok bool)
	Owns(ctx context.Context, v *store.VM) bool
	// Reach returns v ready to serve a request, running (woken if the
	// layer's record of it says a request wakes it); false when the
	// layer holds it unreachable (paused), and leaves it as it is.
	Reach(ctx context.Context, v *store.VM) (*store.VM, bool)
	// Serve answers a request for CompatPort of a running VM it owns.
	Serve(w http.ResponseWriter, r *http.Request, v *store.VM)
	NotFound(w http.ResponseWriter, ref string)
	PortClosed(w http.ResponseWriter, ref string, port int)
	// Principal is the key behind the layer's own credential that r
	// carries, when that key may reach the VM's loopback (nil when r
	// carries none); when it refuses r, it has answered.
	Principal(w http.ResponseWriter, r *http.Request, v *store.VM) (*auth.Principal, bool)
	// Allow vets a request for another port of a VM it owns, by a caller
	// who may reach the VM's loopback or not; when it refuses, it has
	// answered.
	Allow(w http.ResponseWriter, r *http.Request, v *store.VM, port int, loopback bool) bool
}

// Config configures a Proxy.
type Config struct {
	Listen string // e.g. 127.0.0.1:7080
	Domain string // preview host suffix, e.g. localhost
	Auth   *auth.Service
	Store  *store.Store
	VMs    VMs
	Log    *slog.Logger
	// Compat, when set, serves CompatPort of the VMs it owns.
	Compat     Compat
	CompatPort int
	// TLS, when set, makes the proxy HTTPS only (with HTTP/2 by ALPN).
	TLS *tls.Config
	// Key signs preview cookies (cookie.go): the same on every node of a
	// cluster, so a cookie works wherever the preview host leads. Nil: a
	// random key (cookies end with the process).
	Key []byte
	// Forward, when set, may serve a request for a VM that another
	// cluster node runs, once this proxy has checked the caller (by
	// passing it to that node, whose ServeForwarded serves it), and
	// reports whether it did.
	Forward func(w http.ResponseWriter, r *http.Request, v *store.VM) bool
	// ForwardCompat, when set, may pass a request of the compatibility
	// layer for its VM v to the node that runs v, whose proxy serves it as
	// its own (the layer checks its own credentials there), and reports
	// whether it did.
	ForwardCompat func(w http.ResponseWriter, r *http.Request, v *store.VM) bool
}

// Proxy is the preview router.
type Proxy struct {
	cfg  Config
	ln   net.Listener
	srv  *http.Server
	rp   *httputil.ReverseProxy
	log  *slog.Logger
	port string // the listener's port, for URLs
	key  []byte // preview cookies' MAC key (cookie.go)

	tcpMu sync.Mutex
	tcp   map[tcpKey]*tcpListener
}

// Timeouts of the preview server. A browser keeps idle connections open
// for minutes and anyone on the network can open more; the idle timeout
// reclaims them (for h2c too), the header timeout stops a client that
// trickles its headers. Neither limits a long response, a stream or a
// WebSocket once the request is in.
const (
	readHeaderTimeout = 30 * time.Second
	idleTimeout       = 120 * time.Second
)

// TokenParam is the query parameter that carries a token once; the proxy
// moves it into a cookie and redirects to the same URL without it.
const TokenParam = "agentvm_token"

const cookieName = "agentvm_preview"

type ctxKey struct{}

// inKey holds the client's request, which ModifyResponse needs (it sees
// only the outgoing one).
type inKey struct{}

func withTarget(r *http.Request, t target) *http.Request {
	t.gone = r.Context().Done()
	ctx := context.WithValue(r.Context(), ctxKey{}, t)
	return r.WithContext(context.WithValue(ctx, inKey{}, r))
}

type target struct {
	vm     *store.VM
	port   int
	compat bool // a VM the compatibility layer owns
	cdp    bool // the browser image's DevTools port (cdp.go)
	// loopback: the caller may reach servers on the guest's loopback
	// (loopback.go).
	loopback bool
	// asleep: the VM was paused or suspended when the request came, so
	// the request wakes it, and its dial waits a moment for a listener
	// (wakeGrace).
	asleep bool
	// gone ends when the client's request does: the transport dials with
	// a context that outlives it, and the wait after a wake must not.
	gone <-chan struct{}
}

// host is the transport's address for t.
func (t target) host() string {
	if t.loopback {
		return t.vm.ID + hostLoopback + ":" + strconv.Itoa(t.port)
	}
	return t.vm.ID + hostAddress + ":" + strconv.Itoa(t.port)
}

// New binds the listener.
func New(cfg Config) (*Proxy, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Domain = strings.Trim(strings.ToLower(cfg.Domain), ".")
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("preview proxy: listen %s: %w", cfg.Listen, err)
	}
	p := &Proxy{cfg: cfg, ln: ln, log: cfg.Log, tcp: map[tcpKey]*tcpListener{}, key: cfg.Key}
	if len(p.key) == 0 {
		p.key = make([]byte, 32)
		rand.Read(p.key)
	}
	_, p.port, _ = net.SplitHostPort(ln.Addr().String())
	tr := &http.Transport{
		DialContext:           p.dial,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // long polls and slow builds are fine
		DisableCompression:    true,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ctxKey{}).(target)
			pr.SetURL(&url.URL{Scheme: "http", Host: t.host()})
			pr.Out.Host = pr.In.Host // the app sees the preview host it was called by
			if t.cdp {
				pr.Out.Host = cdpHost
			}
			pr.SetXForwarded()
			BoundBody(pr.Out)
			stripToken(pr.Out)
			if t.compat {
				// The sandbox's own credentials, checked here (Compat.Principal).
				pr.Out.Header.Del("X-Access-Token")
				pr.Out.Header.Del("E2B-Traffic-Access-Token")
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			if t, _ := resp.Request.Context().Value(ctxKey{}).(target); t.cdp {
				in := resp.Request.Context().Value(inKey{}).(*http.Request)
				return rewriteCDPAnswer(resp, in.Host, in.TLS != nil)
			}
			return nil
		},
		Transport:     tr,
		FlushInterval: 0, // streaming (no Content-Length, SSE) is flushed at once anyway
		BufferPool:    bufPool{},
		ErrorHandler:  p.proxyError,
		// What it logs is an upstream that broke off a response it had
		// begun (a guest server that died or reset mid-stream): the client
		// sees its stream cut, and this line says where.
		ErrorLog: slog.NewLogLogger(cfg.Log.With("component", "proxy").Handler(), slog.LevelInfo),
	}
	prot := new(http.Protocols)
	prot.SetHTTP1(true)
	if cfg.TLS != nil {
		prot.SetHTTP2(true)
	} else {
		prot.SetUnencryptedHTTP2(true) // h2c with prior knowledge
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout, Protocols: prot, TLSConfig: cfg.TLS}
	return p, nil
}

// Addr is the bound address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the preview URL of a VM port.
func (p *Proxy) URL(vmName string, port int) string {
	return fmt.Sprintf("%s://%d-%s.%s:%s/", p.Scheme(), port, vmName, p.cfg.Domain, p.port)
}

// Scheme is http, or https when the proxy serves TLS.
func (p *Proxy) Scheme() string {
	if p.cfg.TLS != nil {
		return "https"
	}
	return "http"
}

// Domain is the preview host suffix.
func (p *Proxy) Domain() string { return p.cfg.Domain }

// Serve serves until Close.
func (p *Proxy) Serve() error {
	var err error
	if p.cfg.TLS != nil {
		err = p.srv.ServeTLS(p.ln, "", "")
	} else {
		err = p.srv.Serve(p.ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy and every TCP exposure listener.
func (p *Proxy) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	p.srv.Close()
	p.tcpMu.Lock()
	for k, l := range p.tcp {
		l.close()
		delete(p.tcp, k)
	}
	p.tcpMu.Unlock()
	return err
}

// statusNoVM is route's status for a preview host of a VM that does not
// exist: a 404 only for a caller with a valid token (unknownVM).
const statusNoVM = -http.StatusNotFound

// unauthorizedMsg is what a caller without a valid token learns of a
// private preview, or of one whose VM does not exist: the same words, so
// that it cannot tell the two apart or learn a VM's name from its id.
func unauthorizedMsg(port int) string {
	return fmt.Sprintf("this preview (port %d) is private or does not exist: send Authorization: Bearer <token> (a token with the preview permission), or open the URL once with ?%s=<token>; `agentvm expose VM %d --public` makes a port public", port, TokenParam, port)
}

// route finds the VM and port a request is for.
func (p *Proxy) route(r *http.Request) (*store.VM, int, int, string) {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(host, ".")
	if label, ok := strings.CutSuffix(host, "."+p.cfg.Domain); ok && !strings.Contains(label, ".") {
		portStr, ref, ok := strings.Cut(label, "-")
		port, err := strconv.Atoi(portStr)
		if !ok || err != nil || port < 1 || port > 65535 || ref == "" {
			return nil, 0, http.StatusNotFound, fmt.Sprintf("%q is not a preview host: use <port>-<vm>.%s", host, p.cfg.Domain)
		}
		v, err := p.cfg.VMs.Get(r.Context(), ref)
		if err != nil {
			return nil, 0, statusNoVM, fmt.Sprintf("no VM %q", ref)
		}
		return v, port, 0, ""
	}
	d, err := p.cfg.Store.GetDomain(r.Context(), host)
	if err != nil {
		return nil, 0, http.StatusNotFound, fmt.Sprintf("%q is not a preview host: use <port>-<vm>.%s or map a domain through the API", host, p.cfg.Domain)
	}
	v, err := p.cfg.VMs.Get(r.Context(), d.VMID)
	if err != nil {
		return nil, 0, http.StatusNotFound, fmt.Sprintf("the VM of %s is gone", host)
	}
	return v, d.Port, 0, ""
}

func (p *Proxy) public(ctx context.Context, vmID string, port int) bool {
	ports, err := p.cfg.Store.ListPorts(ctx, vmID)
	if err != nil {
		return false
	}
	for _, pt := range ports {
		if pt.Kind == "http" && pt.Port == port && pt.Public {
			return true
		}
	}
	return false
}

// bearer is the agentvm token of a request's Authorization header ("" when
// it carries none, or an app's own).
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		if t := strings.TrimSpace(h[7:]); agentvmSecret(t) {
			return t
		}
	}
	return ""
}

// agentvmSecret reports whether t looks like one of agentvm's secrets: a
// token, the admin token or an E2B API key.
func agentvmSecret(t string) bool {
	return strings.HasPrefix(t, auth.TokenPrefix) || strings.HasPrefix(t, "avm_") || strings.HasPrefix(t, auth.E2BPrefix)
}

// stripToken removes agentvm's credentials before the request reaches the
// app: its bearer tokens and E2B keys, its cookies, and the token query
// parameter (a request that still has it was not redirected, e.g. an E2B
// sandbox's public port).
func stripToken(r *http.Request) {
	if bearer(r) != "" {
		r.Header.Del("Authorization")
	}
	if q := r.URL.Query(); q.Has(TokenParam) {
		q.Del(TokenParam)
		r.URL.RawQuery = q.Encode()
	}
	if cs := r.Cookies(); len(cs) > 0 {
		r.Header.Del("Cookie")
		for _, c := range cs {
			if c.Name != cookieName && c.Name != auth.SessionCookie {
				r.AddCookie(c)
			}
		}
	}
}

// serveCompat answers the requests of the compatibility layer: those it
// routes by its headers and those for VMs it owns. It reports whether it
// answered.
func (p *Proxy) serveCompat(w http.ResponseWriter, r *http.Request, c Compat, v *store.VM, port int) bool {
	ctx := r.Context()
	ref := ""
	if v == nil {
		var ok bool
		if ref, port, ok = c.Route(r); !ok {
			if port, ref := p.hostRef(r); port == p.cfg.CompatPort {
				c.NotFound(w, ref)
				return true
			}
			return false
		}
		var err error
		if v, err = p.cfg.VMs.Get(ctx, ref); err != nil {
			c.NotFound(w, ref)
			return true
		}
	}
	if !c.Owns(ctx, v) {
		if ref != "" || port == p.cfg.CompatPort {
			// Not a sandbox: answered as a missing one, with the
			// caller's own words (a VM's id must not tell its name).
			if ref == "" {
				_, ref = p.hostRef(r)
			}
			c.NotFound(w, ref)
			return true
		}
		return false
	}
	if p.cfg.ForwardCompat != nil && p.cfg.ForwardCompat(w, r, v) {
		return true
	}
	// Its ports are public, but its loopback (and every port of a sandbox
	// whose traffic is private) is reached only with the layer's own
	// credential or an agentvm token that may (loopback.go), tracked under
	// its key. Checked before anything wakes it: a caller it refuses must
	// not resume a paused sandbox.
	var pr *auth.Principal
	if port != p.cfg.CompatPort {
		if pr = p.callerReachesLoopback(r, v); pr == nil {
			var ok bool
			if pr, ok = c.Principal(w, r, v); !ok {
				return true
			}
		}
	}
	// A paused sandbox is unreachable until connect resumes it, unless it
	// asked to be woken by its traffic.
	var reached bool
	asleep, started := v.State != store.StateRunning, v.StartedAt
	if v, reached = c.Reach(ctx, v); !reached {
		c.NotFound(w, v.Name)
		return true
	}
	// A sandbox its timeout was pausing is recorded running until the
	// suspend is done, and Reach woke it after: its machine is new.
	if restarted := (started == nil) != (v.StartedAt == nil) || started != nil && !v.StartedAt.Equal(*started); restarted {
		asleep = true
	}
	defer p.cfg.VMs.Hold(v.ID)()
	if port == p.cfg.CompatPort {
		c.Serve(w, r, v)
		return true
	}
	if pr != nil {
		var done func()
		var err error
		if w, r, done, err = p.cfg.Auth.TrackHTTP(w, r, pr); err != nil {
			page(w, http.StatusTooManyRequests, "Too Many Requests", err.Error())
			return true
		}
		defer done()
	}
	if !c.Allow(w, r, v, port, pr != nil) {
		return true
	}
	p.rp.ServeHTTP(w, withTarget(r, target{vm: v, port: port, compat: true, cdp: isCDP(v, port), loopback: pr != nil, asleep: asleep}))
	return true
}

// hostRef is the port and VM named by a preview host
// "<port>-<vm>.<domain>" (0 and "" when the host is not one).
func (p *Proxy) hostRef(r *http.Request) (int, string) {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.TrimSuffix(host, "."), "."+p.cfg.Domain)
	if !ok {
		return 0, ""
	}
	portStr, ref, _ := strings.Cut(label, "-")
	port, _ := strconv.Atoi(portStr)
	return port, ref
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.serve(w, r, false, false) }

// ServeForwarded serves a preview request another cluster node forwarded
// (Config.Forward there) after it checked the caller's token itself, and
// found whether the caller may reach the VM's loopback (Loopback).
func (p *Proxy) ServeForwarded(w http.ResponseWriter, r *http.Request, loopback bool) {
	p.serve(w, r, true, loopback)
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, authorized, loopback bool) {
	v, port, status, msg := p.route(r)
	if !authorized && p.cfg.Compat != nil && p.serveCompat(w, r, p.cfg.Compat, v, port) {
		return
	}
	if v == nil && status == statusNoVM {
		if _, err := p.caller(r); err != nil && !authorized {
			hostPort, _ := p.hostRef(r)
			page(w, http.StatusUnauthorized, "Unauthorized", unauthorizedMsg(hostPort))
			return
		}
		status = http.StatusNotFound
	}
	if v == nil {
		page(w, status, "Not found", msg)
		return
	}
	if q := r.URL.Query(); !authorized && q.Has(TokenParam) {
		// Move the token into a cookie for this host and drop it from the URL.
		tok := q.Get(TokenParam)
		pr, err := p.cfg.Auth.Authenticate(r.Context(), tok)
		if err != nil || pr.Can(v.ID, "preview") != nil {
			page(w, http.StatusUnauthorized, "Unauthorized", unauthorizedMsg(port))
			return
		}
		http.SetCookie(w, p.previewCookie(r, pr))
		q.Del(TokenParam)
		http.Redirect(w, r, sameHostTarget(r.URL, q), http.StatusFound)
		return
	}
	public := !authorized && p.public(r.Context(), v.ID, port)
	if public {
		// A port the admin made public is served as a private one is to
		// the admin: the port record is the grant.
		loopback = true
	}
	if !authorized && !public {
		pr, err := p.caller(r)
		if err != nil {
			page(w, http.StatusUnauthorized, "Unauthorized", unauthorizedMsg(port))
			return
		}
		if err := pr.Can(v.ID, "preview"); err != nil {
			page(w, http.StatusForbidden, "Forbidden", strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "))
			return
		}
		loopback = pr.ReachesLoopback(v.ID)
		// Revoking or expiring the token ends its open streams and
		// WebSockets too, not only its next request.
		var done func()
		if w, r, done, err = p.cfg.Auth.TrackHTTP(w, r, pr); err != nil {
			page(w, http.StatusTooManyRequests, "Too Many Requests", err.Error())
			return
		}
		defer done()
	}
	if !authorized && p.cfg.Forward != nil && p.cfg.Forward(w, withLoopback(r, loopback), v) {
		return
	}
	if !vm.Reachable(v.State) {
		page(w, http.StatusServiceUnavailable, "VM not running", fmt.Sprintf("%s is %s", v.Name, v.State))
		return
	}
	defer p.cfg.VMs.Hold(v.ID)() // preview traffic keeps the VM awake
	p.rp.ServeHTTP(w, withTarget(r, target{vm: v, port: port, cdp: isCDP(v, port), loopback: loopback, asleep: v.State != store.StateRunning}))
}

// sameHostTarget is where a URL that carried a token redirects to: its path
// and query (without the token) on this same host. Only the path is used,
// never the scheme or host, and leading slashes and backslashes collapse
// to one: a request for "//evil.example/x?agentvm_token=..." would
// otherwise answer "Location: //evil.example/x", which a browser follows to
// another site (an open redirect from a trusted preview host, right after
// setting a cookie).
func sameHostTarget(u *url.URL, q url.Values) string {
	path := u.EscapedPath()
	if u.Opaque != "" {
		path = "/" // "GET http:opaque": no path worth keeping
	}
	path = "/" + strings.TrimLeft(path, "/\\")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(ctxKey{}).(target)
	name := ""
	if t.vm != nil {
		name = t.vm.Name
	}
	if r.Context().Err() != nil {
		return // the client went away
	}
	if t.compat {
		if errors.Is(err, vm.ErrNoListener) {
			p.cfg.Compat.PortClosed(w, name, t.port)
		} else {
			// The layer's answer names no cause (E2B's "sandbox not
			// found"): the log does.
			p.log.Info("preview proxy error", "vm", name, "port", t.port, "compat", true, "err", err)
			p.cfg.Compat.NotFound(w, name)
		}
		return
	}
	switch {
	case errors.Is(err, errAddressOnly):
		page(w, http.StatusBadGateway, "Nothing is listening on the VM's address", fmt.Sprintf("nothing is listening on port %d on the network address of %s. A server bound only to the guest's loopback (127.0.0.1) is served only to a token with the exec permission and no user limit, since such servers trust whoever reaches them: start it on 0.0.0.0:%d to preview it with this token", t.port, name, t.port))
	case errors.Is(err, vm.ErrNoListener):
		page(w, http.StatusBadGateway, "Nothing is listening", fmt.Sprintf("nothing is listening on port %d in %s (start your server on 0.0.0.0:%d or 127.0.0.1:%d)", t.port, name, t.port, t.port))
	case (errors.Is(err, vm.ErrConflict) || errors.Is(err, vm.ErrUnavailable)) && !errors.Is(err, vm.ErrGuestDial):
		page(w, http.StatusServiceUnavailable, "VM not running", err.Error())
	default:
		p.log.Info("preview proxy error", "vm", name, "port", t.port, "err", err)
		page(w, http.StatusBadGateway, "Bad gateway", fmt.Sprintf("port %d in %s: %v", t.port, name, err))
	}
}

// page writes a small HTML error page (plain text for non-browsers is the
// same words).
func page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><title>%d %s</title><h1>%d %s</h1><p>%s</p>\n<!-- agentvm preview proxy -->\n",
		status, html.EscapeString(title), status, html.EscapeString(title), html.EscapeString(msg))
}

type bufPool struct{}

var pool = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (bufPool) Get() []byte  { return *(pool.Get().(*[]byte)) }
func (bufPool) Put(b []byte) { pool.Put(&b) }
