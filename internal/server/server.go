// Package server wires the agentvm daemon: configuration, data-dir lock, auth and
// the HTTP API on top of the VM service.
package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/budget"
	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/cluster"
	"github.com/agentvm/agentvm/internal/console"
	"github.com/agentvm/agentvm/internal/e2b"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/proxy"
	"github.com/agentvm/agentvm/internal/record"
	"github.com/agentvm/agentvm/internal/repos"
	"github.com/agentvm/agentvm/internal/sshgw"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
	"github.com/agentvm/agentvm/internal/vmstats"
)

// Version of agentvm.
var Version = "0.1.0-dev"

// Config is the validated configuration of `agentvm serve`.
type Config struct {
	DataDir            string
	Listen             string
	Accel              string // auto|kvm|tcg
	CacheDir           string
	TemplateDir        string
	RunDir             string
	QEMU               string
	AgentPath          string
	AllowPrivateEgress bool
	// Store is the metadata database: "" is the SQLite file agentvm.db in
	// DataDir; else a path, sqlite:PATH or a postgres:// URL.
	Store string
	// KeepRunning leaves VMs running when the server stops (for daemon upgrades);
	// otherwise they are suspended and woken at the next start.
	KeepRunning bool
	// WarmPool is how many ready VMs to keep per recently created shape.
	WarmPool int
	// Cluster makes the daemon a node of the cluster on its PostgreSQL
	// store (serve --cluster): NodeName (default: the host name) names it,
	// Advertise is the address other nodes and clients reach its API at
	// (default: the listen address), LeaseTTL its lease (0: 15 s).
	// PeerListen is the node-to-node listener other nodes forward
	// requests to (peer.go; "": 127.0.0.1 on a free port).
	Cluster    bool
	NodeName   string
	Advertise  string
	LeaseTTL   time.Duration
	PeerListen string
	// Objects is the object store snapshots are kept in (serve --objects
	// s3://BUCKET/PREFIX; "": none), see objects.OpenS3.
	Objects string
	// StateFormat is vm.Config.StateFormat (serve --state-format).
	StateFormat string
	// KSM turns the host's page merging on and offers it the VMs' RAM
	// (serve --ksm, ksm.go).
	KSM bool
	// GitMaxPush bounds one push to a hosted repository (0: 1 GiB).
	GitMaxPush int64
	// RecordMax bounds each VM's recordings in bytes, RecordRetention
	// how long they are kept (0: the record package's defaults).
	RecordMax       int64
	RecordRetention time.Duration
	// StateCat is vm.Config.StateCat: the agentvm binary, whose state-cat
	// mode reads saved states into QEMU ("": plain cat).
	StateCat string
	// SSHListen is the SSH gateway's address ("" disables it).
	SSHListen string
	// ProxyListen is the preview proxy's address ("" disables it); Domain
	// is the preview host suffix (<port>-<vm>.<domain>).
	ProxyListen string
	Domain      string
	// E2BDomain is the domain E2B sandboxes report ("" = the preview
	// domain with the proxy's port, e.g. localhost:7080); the E2B API
	// needs the preview proxy.
	E2BDomain string
	// TLSCert and TLSKey make the preview proxy serve HTTPS with that
	// (wildcard) certificate; TLSAuto issues one for *.<Domain> from a
	// local CA in the data dir instead.
	TLSCert, TLSKey string
	TLSAuto         bool
	// MemoryBudget bounds what requests hold in the daemon's memory at once
	// (buffered exec output, screenshots): 0 is budget.DefaultLimit, < 0
	// unlimited.
	MemoryBudget int64
	Log          *slog.Logger
}

// DefaultDataDir is $AGENTVM_DATA_DIR or ~/.local/share/agentvm.
func DefaultDataDir() string {
	if d := os.Getenv("AGENTVM_DATA_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "agentvm")
}

// Server is a running daemon.
type Server struct {
	cfg    Config
	svc    *vm.Service
	store  *store.Store
	token  string
	tokens *auth.Service
	ssh    *sshgw.Gateway
	proxy  *proxy.Proxy
	e2b    *e2b.Server
	builds *builder.Builder // templates built from Dockerfiles
	repos  *repos.Service   // hosted git repositories (repos.go)
	rec    *record.Store    // terminal and exec recordings (recordings.go)
	// stopPrune ends the recordings' hourly prune.
	stopPrune chan struct{}
	// guestGit serves the VMs' own connections to their repositories.
	guestGit *guestListener
	metrics  metrics
	// mem is the daemon-wide memory budget of what requests hold (nil:
	// unlimited; serve --memory-budget).
	mem     *budget.Memory
	console *console.Console // the web console (console.go)
	usage   *vmstats.Sampler // each running VM's recent CPU and memory
	lock    *os.File
	http    *http.Server
	ln      net.Listener
	log     *slog.Logger
	accel   string
	member  *cluster.Member // the cluster membership (nil: not a cluster node)
	// memberStop and memberDone end the membership's renewals (leaveCluster).
	memberStop context.CancelFunc
	memberDone chan struct{}
	nodes      nodeCache
	peers      *peers       // node-to-node listener and forwarding (nil: not a cluster node)
	authed     http.Handler // the authenticated routes, which the peer listener serves too
	// guestFn, when set, replaces svc.Guest for the service, job and
	// process relays (tests put a fake agent behind it).
	guestFn func(ctx context.Context, ref string) (*store.VM, *guest.Client, error)
}

// New validates cfg, takes the data-dir lock, opens the store, reconciles VMs and
// binds the listener. It fails fast and clearly when something is missing.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:7070"
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = image.DefaultCacheDir()
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	accel, why, err := qemu.ResolveAccel(cfg.Accel)
	if err != nil {
		return nil, err
	}
	if cfg.KSM {
		if err := enableKSM(); err != nil {
			return nil, err
		}
	}
	qv, err := qemu.Version(cfg.QEMU)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return nil, fmt.Errorf("qemu-img not found: install it with: apt-get install qemu-utils")
	}
	if cfg.AgentPath == "" {
		cfg.AgentPath = findAgent()
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, fmt.Errorf("guest agent binary not found at %q (build it with: CGO_ENABLED=0 go build -o bin/agentvm-guest ./cmd/agentvm-guest, or pass --guest-agent)", cfg.AgentPath)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(cfg.DataDir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("another agentvm server is already using data dir %s", cfg.DataDir)
	}
	s := &Server{cfg: cfg, lock: lock, log: cfg.Log, accel: accel}
	switch {
	case cfg.MemoryBudget == 0:
		s.mem = budget.New(budget.DefaultLimit)
	case cfg.MemoryBudget > 0:
		s.mem = budget.New(cfg.MemoryBudget)
	}
	ok := false
	defer func() {
		if !ok {
			s.closeResources()
		}
	}()
	if s.token, err = loadOrCreateToken(filepath.Join(cfg.DataDir, "admin.token")); err != nil {
		return nil, err
	}
	if cfg.RunDir, err = prepareRunDir(cfg.RunDir, cfg.DataDir); err != nil {
		return nil, err
	}
	s.cfg.RunDir = cfg.RunDir
	dsn := cfg.Store
	if dsn == "" {
		dsn = filepath.Join(cfg.DataDir, "agentvm.db")
	}
	if s.store, err = store.OpenContext(ctx, dsn); err != nil {
		return nil, err
	}
	s.log.Info("metadata store", "backend", s.store.Backend(), "store", store.Redact(dsn))
	// One daemon per shared database: the records name this data dir's
	// files. (A SQLite file is the data dir's own; a daemon that lost its
	// instance-id must not be locked out of it.)
	// In a cluster the database is shared by design: the data dir's
	// identity is the node's, and each node runs its own VMs.
	var nodeID string
	if s.store.Backend() == "postgres" {
		owner, err := loadOrCreateRandom(filepath.Join(cfg.DataDir, "instance-id"), "", 16)
		if err != nil {
			return nil, err
		}
		if cfg.Cluster {
			nodeID = owner
		} else if err := s.store.ClaimOwner(ctx, owner); err != nil {
			return nil, fmt.Errorf("metadata store %s: %w", store.Redact(dsn), err)
		}
	} else if cfg.Cluster {
		return nil, fmt.Errorf("--cluster: %w", store.ErrNoCluster)
	}
	if cfg.Cluster { // a write that waits for the database lands before the lease can run out
		ttl := cfg.LeaseTTL
		if ttl == 0 {
			ttl = cluster.DefaultTTL
		}
		s.store.SetRetryBudget(ttl / 4)
	}
	if cfg.PeerListen != "" && !cfg.Cluster {
		return nil, errors.New("--peer-listen goes with --cluster: only cluster nodes forward requests to each other")
	}
	if cfg.Cluster && cfg.KeepRunning {
		return nil, errors.New("--keep-running cannot go with --cluster: a node that stops gives up its lease, and its VMs must not run on without one")
	}
	s.tokens = auth.New(s.store, s.token)
	s.rec = record.New(record.Config{Dir: filepath.Join(cfg.DataDir, "recordings"), MaxPerVM: cfg.RecordMax, Retention: cfg.RecordRetention, Log: cfg.Log,
		Evicted: func(vmID string, n int, first time.Time) {
			s.svc.EventData(vmID, "recording", "system", map[string]string{"evicted": strconv.Itoa(n)},
				"%d oldest recordings removed to keep the VM's recordings within their bound (the oldest begun %s)", n, first.Format(time.RFC3339))
		}})
	if cfg.Cluster { // a revoke here ends the token's connections on every node
		s.tokens.SetBroadcast(s.broadcast)
	}
	s.console, s.usage = newConsole(s), vmstats.New(metricsInterval)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	s.ln = ln
	apiAddr, err := network.ParseListeners(ln.Addr().String())
	if err != nil {
		return nil, err
	}
	policy := network.Policy{AllowPrivate: cfg.AllowPrivateEgress, Listeners: apiAddr}
	var objs *objects.Store
	if cfg.Objects != "" {
		b, err := objects.OpenS3(ctx, cfg.Objects)
		if err != nil {
			return nil, fmt.Errorf("--objects: %w", err)
		}
		objs = objects.New(b)
	}
	s.svc, err = vm.New(vm.Config{
		DataDir: cfg.DataDir, RunDir: cfg.RunDir, CacheDir: cfg.CacheDir, TemplateDir: cfg.TemplateDir,
		QEMU: cfg.QEMU, QEMUVersion: qv, Accel: accel, AgentPath: cfg.AgentPath, Policy: policy, Log: cfg.Log,
		ImageProgress: func(step string) { cfg.Log.Info("image build", "step", step) },
		PoolSize:      cfg.WarmPool,
		StateFormat:   cfg.StateFormat,
		StateCat:      cfg.StateCat,
		KSM:           cfg.KSM,
		Node:          nodeID,
		NodeLost:      s.nodeLost,
		Objects:       objs,
	}, s.store)
	if err != nil {
		return nil, err
	}
	if cfg.SSHListen != "" {
		gw := sshgw.Config{Listen: cfg.SSHListen, HostKeyPath: filepath.Join(cfg.DataDir, "ssh_host_ed25519_key"),
			Auth: s.tokens, VMs: s.svc, Log: cfg.Log, Record: s.rec}
		if cfg.Cluster { // one host key for the cluster; logins go on to the VM's node
			if gw.HostKey, err = clusterSSHKey(ctx, s.store, gw.HostKeyPath); err != nil {
				return nil, err
			}
			gw.Forward = s.forwardSSH
		}
		s.ssh, err = sshgw.New(gw)
		if err != nil {
			return nil, err
		}
		cfg.Log.Info("ssh gateway ready", "listen", s.ssh.Addr())
	}
	if cfg.ProxyListen != "" {
		key, err := loadOrCreateToken(filepath.Join(cfg.DataDir, "e2b.key"))
		if err != nil {
			return nil, err
		}
		ec := e2b.Config{VMs: s.svc, Store: s.store, Tokens: s.tokens, Key: []byte(key), Log: cfg.Log, Record: s.rec}
		if cfg.Cluster { // a sandbox's envd token is good on every node; requests go on to its node
			if key, err = clusterSecret(ctx, s.store, e2bKeyMeta, key); err != nil {
				return nil, err
			}
			ec.Key, ec.Forward = []byte(key), s.forwardE2B
		}
		s.e2b = e2b.New(ec)
		tlsCfg, err := proxyTLS(cfg)
		if err != nil {
			return nil, err
		}
		s.proxy, err = proxy.New(proxy.Config{Listen: cfg.ProxyListen, Domain: cfg.Domain, Auth: s.tokens, Store: s.store, VMs: s.svc, Log: cfg.Log,
			Compat: e2b.Proxy{Server: s.e2b}, CompatPort: e2b.EnvdPort, TLS: tlsCfg, Forward: s.forwardPreview, ForwardCompat: s.forwardCompat,
			Key: ec.Key})
		if err != nil {
			return nil, err
		}
		domain := cfg.E2BDomain
		if domain == "" {
			_, port, _ := net.SplitHostPort(s.proxy.Addr())
			domain = s.proxy.Domain() + ":" + port
		}
		s.e2b.SetDomain(domain)
		cfg.Log.Info("preview proxy ready", "listen", s.proxy.Addr(), "domain", s.proxy.Domain())
	}
	// No VM reaches agentvm's own listeners, whatever its egress policy,
	// --allow-host or --allow-private-egress say.
	own, err := network.ParseListeners(s.Addr(), s.SSHAddr(), s.ProxyAddr())
	if err != nil {
		return nil, err
	}
	s.svc.Networks().SetDaemonListeners(own)
	if err := s.startRepos(); err != nil {
		return nil, err
	}
	s.startRecordings()
	s.svc.OnDelete(s.forgetDeletedVM)
	s.svc.OnOp(s.metrics.observe) // lifecycle latencies; exec and other relays observe their own
	if cfg.Cluster {
		n, err := s.clusterNode(nodeID, qv)
		if err != nil {
			return nil, err
		}
		if n.PeerAddress, err = s.startPeers(ctx, nodeID); err != nil {
			return nil, err
		}
		if err := s.joinCluster(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := s.svc.Reconcile(ctx); err != nil {
		return nil, err
	}
	s.builds = builder.New(s.svc, s.store, filepath.Join(cfg.DataDir, "builds"), nodeID, cfg.Log)
	s.builds.Cleanup(ctx)
	if s.e2b != nil {
		s.e2b.SetTemplates(s.builds, filepath.Join(cfg.DataDir, "e2b-template-files"))
	}
	if s.proxy != nil {
		s.restoreTCPExposures(ctx)
	}
	cfg.Log.Info("agentvm ready", "listen", ln.Addr().String(), "data_dir", cfg.DataDir, "accel", accel, "accel_reason", why, "qemu", qv)
	s.http = newHTTPServer(s.routes())
	ok = true
	return s, nil
}

// SSHAddr is the SSH gateway's bound address ("" when disabled).
func (s *Server) SSHAddr() string {
	if s.ssh == nil {
		return ""
	}
	return s.ssh.Addr()
}

// ProxyAddr is the preview proxy's bound address ("" when disabled).
func (s *Server) ProxyAddr() string {
	if s.proxy == nil {
		return ""
	}
	return s.proxy.Addr()
}

// Addr is the bound listen address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Warm builds the images and templates of this shape so the first creates are
// fast, and fills their warm pools.
func (s *Server) Warm(ctx context.Context, images []string, cpus int, memMiB int64) error {
	var errs []error
	for _, name := range images {
		if _, err := s.svc.EnsureTemplate(ctx, name, cpus, memMiB); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if err := s.svc.WarmPool(name, cpus, memMiB); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Serve serves until ctx is done, then detaches from VMs (they keep running).
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 4) // API, SSH gateway, preview proxy, peer listener
	go func() { errc <- s.http.Serve(s.ln) }()
	if s.ssh != nil {
		go func() {
			if err := s.ssh.Serve(); err != nil {
				errc <- fmt.Errorf("ssh gateway: %w", err)
			}
		}()
	}
	if s.proxy != nil {
		go func() {
			if err := s.proxy.Serve(); err != nil {
				errc <- fmt.Errorf("preview proxy: %w", err)
			}
		}()
	}
	if s.peers != nil {
		go func() {
			if err := s.servePeers(); err != nil {
				errc <- fmt.Errorf("peer listener: %w", err)
			}
		}()
	}
	if s.member != nil {
		go s.hearNodes(ctx)
	}
	go s.svc.WakeMarked(ctx)
	go s.svc.RunPolicies(ctx, 5*time.Second)
	go s.svc.RunLogCap(ctx, time.Second)
	go s.runUsage(ctx)
	if s.e2b != nil {
		go s.e2b.Run(ctx, time.Second)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		s.closeResources()
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.http.Shutdown(sctx)
	if s.ssh != nil {
		s.ssh.Close()
		s.ssh = nil
	}
	if s.proxy != nil {
		s.proxy.Close()
		s.proxy = nil
	}
	if s.peers != nil { // after the proxy, which forwards through it
		s.peers.close()
	}
	if s.builds != nil { // builds end, and delete their VMs, before the VMs are saved
		s.builds.Close()
	}
	if !s.cfg.KeepRunning {
		actx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		s.svc.SuspendAll(actx)
		cancel()
	}
	s.leaveCluster() // once its VMs are saved
	s.closeResources()
	return nil
}

func (s *Server) closeResources() {
	if s.builds != nil { // before the VM service: a build ends by deleting its VM
		s.builds.Close()
	}
	if s.guestGit != nil {
		s.guestGit.close()
	}
	if s.stopPrune != nil {
		close(s.stopPrune)
		s.stopPrune = nil
	}
	if s.repos != nil {
		s.repos.Close()
	}
	s.leaveCluster()
	if s.peers != nil {
		s.peers.close()
	}
	if s.ssh != nil {
		s.ssh.Close()
	}
	if s.proxy != nil {
		s.proxy.Close()
	}
	if s.svc != nil {
		s.svc.Close()
		os.Remove(s.cfg.RunDir) // only if empty: running VMs keep their sockets
	}
	if s.ln != nil {
		s.ln.Close()
	}
	if s.store != nil {
		s.store.Close()
	}
	if s.lock != nil {
		s.lock.Close()
	}
}

func loadOrCreateToken(path string) (string, error) {
	return loadOrCreateRandom(path, "avm_", 24)
}

// loadOrCreateRandom reads the value kept in path, or makes one (prefix and
// n random bytes in hex) and keeps it there.
func loadOrCreateRandom(path, prefix string, n int) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	}
	b := make([]byte, n)
	rand.Read(b)
	t := prefix + hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return t, nil
}

// proxyTLS is the preview proxy's TLS configuration (nil: plain HTTP).
func proxyTLS(cfg Config) (*tls.Config, error) {
	switch {
	case cfg.TLSAuto && (cfg.TLSCert != "" || cfg.TLSKey != ""):
		return nil, errors.New("give either --tls auto or --tls-cert/--tls-key, not both")
	case cfg.TLSAuto:
		domain := strings.Trim(strings.ToLower(cfg.Domain), ".")
		if domain == "" {
			domain = "localhost"
		}
		ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		if h, _, err := net.SplitHostPort(cfg.ProxyListen); err == nil {
			if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
				ips = append(ips, ip)
			}
		}
		return proxy.AutoTLS(cfg.DataDir, domain, ips)
	case cfg.TLSCert != "" || cfg.TLSKey != "":
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return nil, errors.New("--tls-cert and --tls-key go together")
		}
		return proxy.LoadTLS(cfg.TLSCert, cfg.TLSKey)
	}
	return nil, nil
}

// forgetDeletedVM ends what outlives a deleted VM outside the VM service,
// whoever deleted it (a request, a delete-after policy, a failed fork): its
// tokens with their live connections, its preview routes and TCP listeners.
func (s *Server) forgetDeletedVM(id string) {
	if err := s.tokens.ForgetVM(context.Background(), id); err != nil {
		s.log.Warn("delete tokens of a deleted VM", "vm", id, "err", err)
	}
	if s.proxy != nil {
		s.proxy.ForgetVM(id)
	}
	if s.e2b != nil {
		s.e2b.Forget(id)
	}
	s.rec.Forget(id)
	if s.repos != nil {
		if err := s.repos.ForgetVM(context.Background(), id); err != nil {
			s.log.Warn("forget the repository of a deleted VM", "vm", id, "err", err)
		}
	}
}

func findAgent() string {
	if p := os.Getenv("AGENTVM_GUEST_AGENT"); p != "" {
		return p
	}
	if exe, err := os.Executable(); err == nil {
		return filepath.Join(filepath.Dir(exe), "agentvm-guest")
	}
	return "agentvm-guest"
}

// Timeouts of the API server. Without an idle timeout every client that
// opens a keep-alive connection and goes quiet holds a socket and a
// goroutine for ever; without a header timeout a client that sends its
// request line a byte at a time does. Long requests (exec, terminals,
// followed logs) are not bounded by either: the idle timeout only runs
// between requests and the header timeout only until the headers are in.
const (
	apiReadHeaderTimeout = 10 * time.Second
	apiIdleTimeout       = 120 * time.Second
)

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: apiReadHeaderTimeout, IdleTimeout: apiIdleTimeout}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// switchProtocols takes over the request's connection and answers 101 with
// Upgrade: proto. When it cannot, it answers an error (or closes the
// connection) itself and returns ok false; br holds what the client sent
// after its request.
func switchProtocols(w http.ResponseWriter, proto string) (conn net.Conn, br *bufio.Reader, ok bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, "cannot upgrade: "+err.Error())
		return nil, nil, false
	}
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + proto + "\r\nConnection: Upgrade\r\n\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, false
	}
	return conn, brw.Reader, true
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: msg}})
}

// writeErr maps service errors to HTTP statuses: the one place that does so.
func writeErr(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, api.CodeInternal
	switch {
	case errors.Is(err, vm.ErrInvalid):
		status, code = http.StatusBadRequest, api.CodeInvalid
	case errors.Is(err, vm.ErrNotFound):
		status, code = http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, vm.ErrOtherNode):
		status, code = http.StatusMisdirectedRequest, api.CodeOtherNode
	case errors.Is(err, vm.ErrStateIncompatible):
		status, code = http.StatusConflict, api.CodeStateIncompatible
	case errors.Is(err, vm.ErrConflict):
		status, code = http.StatusConflict, api.CodeConflict
	case errors.Is(err, vm.ErrInsufficient):
		status, code = http.StatusInsufficientStorage, api.CodeInsufficient
	case errors.Is(err, auth.ErrInvalid), errors.Is(err, repos.ErrInvalid):
		status, code = http.StatusBadRequest, api.CodeInvalid
	case errors.Is(err, repos.ErrNotFound):
		status, code = http.StatusNotFound, api.CodeNotFound
	case errors.Is(err, repos.ErrConflict):
		status, code = http.StatusConflict, api.CodeConflict
	case errors.Is(err, auth.ErrForbidden):
		status, code = http.StatusForbidden, api.CodeForbidden
	case errors.Is(err, vm.ErrUnavailable), errors.Is(err, store.ErrUnreachable), errors.Is(err, repos.ErrUnavailable):
		status, code = http.StatusServiceUnavailable, api.CodeUnavailable
	}
	msg := err.Error()
	for _, p := range []string{vm.ErrOtherNode.Error() + ": ", vm.ErrInvalid.Error() + ": ", vm.ErrNotFound.Error() + ": ", vm.ErrConflict.Error() + ": ", vm.ErrInsufficient.Error() + ": ", vm.ErrUnavailable.Error() + ": ", auth.ErrInvalid.Error() + ": ", auth.ErrForbidden.Error() + ": ",
		repos.ErrInvalid.Error() + ": ", repos.ErrNotFound.Error() + ": ", repos.ErrConflict.Error() + ": ", repos.ErrUnavailable.Error() + ": "} {
		msg = strings.TrimPrefix(msg, p)
	}
	writeError(w, status, code, msg)
}
