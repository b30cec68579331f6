package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/cluster"
	"github.com/agentvm/agentvm/internal/e2b"
	"github.com/agentvm/agentvm/internal/proxy"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// Routing between cluster nodes: any node answers a request about any VM.
// A node that receives a request for a VM another node runs authenticates
// the caller as usual, then forwards the request to the owner's peer
// listener (TLS, a node certificate of the cluster's CA on both ends, see
// cluster.PeerTLS), naming the caller in principalHeader; the owner checks
// the caller's rights itself, as for its own clients. Upgraded
// connections (exec, terminals, TCP) and streams pass through.

// principalHeader names the caller of a forwarded API request
// (auth.Claim). It is honoured only on the peer listener: on the public
// API forwardToOwner overwrites it.
const principalHeader = "Agentvm-Principal"

// previewHeader marks a preview request forwarded to the owner's preview
// proxy once the forwarding node's proxy checked the caller's token.
const previewHeader = "Agentvm-Preview"

type forwardedKey struct{}

// previewKey marks a request forwardPreview (value previewChecked) or
// forwardCompat (previewCompat) passes on: only then does the forward
// carry previewHeader with that value (a client's own is always dropped).
type previewKey struct{}

// The values of previewHeader: a preview whose caller the forwarding
// node's proxy checked, or a request of the E2B layer (envd), which the
// owner's proxy serves as its own, checking its credentials there.
const (
	previewChecked  = "1"
	previewLoopback = "loopback" // checked, and the caller may reach the VM's loopback (proxy.Loopback)
	previewCompat   = "compat"
)

// forwarded reports whether r came from another node.
func forwarded(r *http.Request) bool { return r.Context().Value(forwardedKey{}) != nil }

// peers is this node's side of node-to-node traffic.
type peers struct {
	tls *cluster.PeerTLS
	ln  net.Listener
	srv *http.Server

	mu        sync.Mutex
	proxies   map[string]peerProxy // by node id
	closeOnce sync.Once
	// failed, when set, may answer a request whose forward to node id
	// failed, and reports whether it did.
	failed func(w http.ResponseWriter, r *http.Request, id string) bool
}

type peerProxy struct {
	addr string
	rp   *httputil.ReverseProxy
	tr   *http.Transport
}

// startPeers opens the node-to-node listener (serve --peer-listen) and
// returns the address other nodes dial.
func (s *Server) startPeers(ctx context.Context, nodeID string) (string, error) {
	pt, err := cluster.NewPeerTLS(ctx, s.store, nodeID)
	if err != nil {
		return "", err
	}
	listen := s.cfg.PeerListen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", fmt.Errorf("--peer-listen %s: %w", listen, err)
	}
	addr, err := peerAdvertise(ln.Addr().(*net.TCPAddr), s.cfg.Advertise, s.Addr())
	if err != nil {
		ln.Close()
		return "", err
	}
	// The routes are made after start-up: they are looked up per request.
	mux := http.NewServeMux()
	mux.Handle("GET /peer/ssh/{id}", s.peerAuth(http.HandlerFunc(s.sshPeer)))
	if s.e2b != nil { // the E2B control plane's requests about this node's sandboxes
		e2bMux := http.NewServeMux()
		s.e2b.Routes(e2bMux)
		e2bAs := s.peerAuth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e2bMux.ServeHTTP(w, r.WithContext(e2b.WithCaller(r.Context(), principal(r))))
		}))
		mux.Handle("/sandboxes/", e2bAs)
		mux.Handle("/v2/sandboxes/", e2bAs)
	}
	mux.Handle("/", s.peerAuth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.authed.ServeHTTP(w, r) })))
	srv := newHTTPServer(mux)
	s.peers = &peers{tls: pt, ln: tls.NewListener(ln, pt.Server()), srv: srv, proxies: map[string]peerProxy{}, failed: s.forwardFailed}
	return addr, nil
}

// forwardFailed answers an API request whose owner did not answer because
// it is gone (the node cache had not seen its lease run out yet) as for
// any lost node's VM: 421, the VM runs nowhere. (The request itself, its
// body given to the failed forward, is not served again.) Otherwise (the
// node lives, or it was a preview) the caller gets a 503.
func (s *Server) forwardFailed(w http.ResponseWriter, r *http.Request, id string) bool {
	if r.Context().Value(previewKey{}) != nil || r.Context().Err() != nil {
		return false
	}
	n, err := s.store.GetNode(r.Context(), id)
	if err != nil || n.Alive {
		return false
	}
	s.nodes.invalidate()
	writeErr(w, fmt.Errorf("%w: its node %s is lost (its lease ran out): it runs nowhere until that node is back, or (with an object store) another node restores it from its stored state or newest stored snapshot when next asked; agentvm delete forgets it", vm.ErrOtherNode, n.Name))
	return true
}

// peerAdvertise is the address other nodes reach the peer listener at:
// the listener's, or when it listens on every interface, the API's
// advertised host with the listener's port; refused when that host is
// itself every interface (no node could dial it).
func peerAdvertise(ln *net.TCPAddr, advertise, apiAddr string) (string, error) {
	if !ln.IP.IsUnspecified() {
		return ln.String(), nil
	}
	host := advertise
	if host == "" {
		host = apiAddr
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("--peer-listen %s listens on every interface: give --advertise the address other nodes reach this host at", ln)
	}
	return net.JoinHostPort(host, fmt.Sprint(ln.Port)), nil
}

// servePeers serves forwarded requests until the listener closes.
func (s *Server) servePeers() error {
	err := s.peers.srv.Serve(s.peers.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// peerAuth admits requests from other nodes (their certificate was checked
// by the TLS handshake) as the caller they name, or passes a forwarded
// preview request to this node's preview proxy.
func (s *Server) peerAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := cluster.NodeOf(r.TLS)
		if err != nil {
			writeError(w, http.StatusForbidden, api.CodeForbidden, "the peer listener serves only cluster nodes: "+err.Error())
			return
		}
		// A certificate outlives its node's removal: only a node the
		// cluster still has, with a lease that runs, is served.
		if n, ok := s.nodes.lookup(s, id); !ok || !n.alive {
			writeError(w, http.StatusForbidden, api.CodeForbidden, "the peer listener serves only live nodes of this cluster")
			return
		}
		if mode := r.Header.Get(previewHeader); mode != "" {
			r.Header.Del(previewHeader)
			if s.proxy == nil {
				writeError(w, http.StatusNotFound, api.CodeNotFound, "this node runs no preview proxy (serve --proxy-listen)")
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true))
			if mode == previewCompat {
				s.proxy.ServeHTTP(w, r)
				return
			}
			s.proxy.ServeForwarded(w, r, mode == previewLoopback)
			return
		}
		p, err := s.tokens.Claimed(r.Context(), r.Header.Get(principalHeader))
		if err != nil {
			if errors.Is(err, auth.ErrUnauthenticated) {
				writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "the forwarded token is unknown, expired or revoked")
				return
			}
			writeErr(w, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true))
		s.serveAs(w, r, p, next)
	})
}

// vmRef is the VM a request's path names (/v1/vms/{ref}[/...]), if any.
func vmRef(path string) string { return pathRef(path, "/v1/vms/") }

// snapshotRef is the snapshot a request's path names (/v1/snapshots/{ref}).
func snapshotRef(path string) string { return pathRef(path, "/v1/snapshots/") }

func pathRef(path, prefix string) string {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return ""
	}
	ref, _, _ := strings.Cut(rest, "/")
	return ref
}

// ownerOf is the node that runs the VM, or keeps the snapshot, r's path
// names ("" for none, or a request about neither).
func (s *Server) ownerOf(r *http.Request) string {
	if ref := vmRef(r.URL.Path); ref != "" {
		if v, err := s.store.GetVM(r.Context(), ref); err == nil {
			return v.Node
		}
		return ""
	}
	if ref := snapshotRef(r.URL.Path); ref != "" {
		if sn, err := s.store.GetSnapshot(r.Context(), ref); err == nil {
			return sn.Node
		}
	}
	return ""
}

// otherLiveNode is node id when it is a live node other than this one,
// as the node cache has it (read again at most every two seconds, and at
// once for a node it does not know): a node lost since is tried, and when
// the forward fails forwardFailed answers here.
func (s *Server) otherLiveNode(id string) *store.Node {
	if s.peers == nil || id == "" || id == s.member.Node().ID {
		return nil
	}
	n, ok := s.nodes.lookup(s, id)
	if !ok || !n.alive || n.peer == "" {
		return nil
	}
	return &store.Node{ID: id, Name: n.name, PeerAddress: n.peer}
}

// forwardPreview passes a preview request for another node's VM to that
// node's preview proxy (proxy.Config.Forward).
func (s *Server) forwardPreview(w http.ResponseWriter, r *http.Request, v *store.VM) bool {
	if proxy.Loopback(r) {
		return s.forwardToProxy(w, r, v, previewLoopback)
	}
	return s.forwardToProxy(w, r, v, previewChecked)
}

// forwardCompat passes a request of the E2B layer's (envd) for another
// node's sandbox to that node's proxy, credentials and all: the layer
// checks them there (proxy.Config.ForwardCompat).
func (s *Server) forwardCompat(w http.ResponseWriter, r *http.Request, v *store.VM) bool {
	return s.forwardToProxy(w, r, v, previewCompat)
}

// forwardToProxy passes r to the proxy of the node that runs v, when that
// is another live node, as a previewHeader request of the given mode.
func (s *Server) forwardToProxy(w http.ResponseWriter, r *http.Request, v *store.VM, mode string) bool {
	n := s.otherLiveNode(v.Node)
	if n == nil || forwarded(r) {
		return false
	}
	s.peers.proxy(n).ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), previewKey{}, mode)))
	return true
}

// forwardE2B passes a request of the E2B control plane about another
// node's sandbox to that node, naming the caller (e2b.Config.Forward).
func (s *Server) forwardE2B(w http.ResponseWriter, r *http.Request, p *auth.Principal, v *store.VM) bool {
	return !forwarded(r) && s.forwardAs(w, r, p, v.Node)
}

// forwardAs forwards r, made by p, to node id when that is another live
// node, naming p, and reports whether it did.
func (s *Server) forwardAs(w http.ResponseWriter, r *http.Request, p *auth.Principal, id string) bool {
	n := s.otherLiveNode(id)
	if n == nil {
		return false
	}
	r.Header.Set(principalHeader, p.Claim())
	s.peers.proxy(n).ServeHTTP(w, r)
	return true
}

// forwardToOwner forwards r to the node that runs the VM (or keeps the
// snapshot) its path names, when that is another live node, and reports
// whether it did. A VM of a node that is gone, or of no node, is answered
// here (421 other_node, or what the handler says).
func (s *Server) forwardToOwner(w http.ResponseWriter, r *http.Request, p *auth.Principal) bool {
	if s.peers == nil || forwarded(r) {
		return false
	}
	if err := s.svc.CheckFenced(); err != nil && (vmRef(r.URL.Path) != "" || snapshotRef(r.URL.Path) != "") {
		// A fenced node is out of the cluster, and its database may be
		// what is gone: it neither looks the owner up nor forwards.
		writeErr(w, err)
		return true
	}
	return s.forwardAs(w, r, p, s.ownerOf(r))
}

// proxy is the reverse proxy to node n's peer listener.
func (pp *peers) proxy(n *store.Node) *httputil.ReverseProxy { return pp.get(n).rp }

// transport is the connection pool to node n's peer listener.
func (pp *peers) transport(n *store.Node) *http.Transport { return pp.get(n).tr }

func (pp *peers) get(n *store.Node) peerProxy {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if p, ok := pp.proxies[n.ID]; ok && p.addr == n.PeerAddress {
		return p
	}
	id, addr, name := n.ID, n.PeerAddress, n.Name
	tr := &http.Transport{
		TLSClientConfig:     pp.tls.Client(n.ID),
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", addr
			pr.SetXForwarded()
			proxy.BoundBody(pr.Out)
			if mode, ok := pr.In.Context().Value(previewKey{}).(string); ok {
				// A preview this node's proxy let through, or an E2B
				// request: the owner's proxy serves it by its host, which
				// names the VM and port.
				pr.Out.Host = pr.In.Host
				pr.Out.Header.Set(previewHeader, mode)
				pr.Out.Header.Del(principalHeader)
				return
			}
			// An API request: the owner trusts the caller this node
			// names (forwardToOwner sets it), not the caller's credentials.
			pr.Out.Host = addr
			pr.Out.Header.Del(previewHeader)
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Api-Key")
			pr.Out.Header.Del("Cookie")
			if q := pr.Out.URL.Query(); q.Has("access_token") {
				q.Del("access_token")
				pr.Out.URL.RawQuery = q.Encode()
			}
		},
		Transport:     tr,
		FlushInterval: -1, // streams (NDJSON exec, followed events) as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if pp.failed != nil && pp.failed(w, r, id) {
				return
			}
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable,
				fmt.Sprintf("the VM runs on node %s, which did not answer: %v", name, err))
		},
	}
	if old, ok := pp.proxies[n.ID]; ok {
		old.tr.CloseIdleConnections()
	}
	p := peerProxy{addr: addr, rp: rp, tr: tr}
	pp.proxies[n.ID] = p
	return p
}

// close stops the peer listener and its connections (once).
func (pp *peers) close() {
	pp.closeOnce.Do(pp.doClose)
}

func (pp *peers) doClose() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	pp.srv.Shutdown(ctx)
	cancel()
	pp.ln.Close()
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range pp.proxies {
		p.tr.CloseIdleConnections()
	}
}
