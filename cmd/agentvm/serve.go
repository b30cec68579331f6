package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/server"
	"github.com/agentvm/agentvm/internal/vm"
	"github.com/spf13/cobra"
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func serveCmd() *cobra.Command {
	var cfg server.Config
	var noWarm bool
	var warmImages []string
	var tlsMode, memBudget, gitMaxPush, recordMax string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the agentvm daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Store == "" {
				cfg.Store = os.Getenv("AGENTVM_STORE")
			}
			switch tlsMode {
			case "":
			case "auto":
				cfg.TLSAuto = true
			default:
				return fmt.Errorf("--tls: want auto (or --tls-cert/--tls-key), got %q", tlsMode)
			}
			switch strings.ToLower(strings.TrimSpace(memBudget)) {
			case "0", "off", "none", "unlimited":
				cfg.MemoryBudget = -1
			default:
				n, err := api.ParseSize(memBudget)
				if err != nil {
					return fmt.Errorf("--memory-budget: %w", err)
				}
				if n < 64<<20 {
					return fmt.Errorf("--memory-budget: %s is less than 64 MiB, too little for one screenshot (0 or off: unlimited)", memBudget)
				}
				cfg.MemoryBudget = int64(n)
			}
			n, err := api.ParseSize(gitMaxPush)
			if err != nil || n < 1<<20 {
				return fmt.Errorf("--git-max-push %q: a size of at least 1M, e.g. 512M or 2G", gitMaxPush)
			}
			cfg.GitMaxPush = int64(n)
			if n, err = api.ParseSize(recordMax); err != nil || n < 64<<10 {
				return fmt.Errorf("--record-max %q: a size of at least 64K, e.g. 64M", recordMax)
			}
			cfg.RecordMax = int64(n)
			for _, name := range warmImages {
				if _, err := image.Resolve(name); err != nil {
					return fmt.Errorf("--warm-images: %w", err)
				}
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			if err := vm.ValidStateFormat(cfg.StateFormat); err != nil {
				return fmt.Errorf("--state-format: %w", err)
			}
			if exe, err := os.Executable(); err == nil {
				cfg.StateCat = exe // restores read state with splice
			}
			if cfg.TLSAuto && !strings.Contains(strings.Trim(cfg.Domain, "."), ".") {
				// RFC 6125 clients (Node, OpenSSL, browsers) refuse a
				// wildcard over a single label: *.localhost matches nothing.
				cfg.Log.Warn("--tls auto with a one-label --domain: clients refuse its wildcard certificate *."+cfg.Domain+
					" for preview hosts (the proxy's own address still works); use a domain of two labels or more, e.g. agentvm."+cfg.Domain, "domain", cfg.Domain)
			}
			s, err := server.New(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "agentvm listening on http://%s (admin token in %s/admin.token)\n", s.Addr(), cfg.DataDir)
			if a := s.ProxyAddr(); a != "" {
				scheme := "http"
				if cfg.TLSAuto || cfg.TLSCert != "" {
					scheme = "https"
				}
				fmt.Fprintf(os.Stderr, "preview proxy on %s://%s (%s://<port>-<vm>.%s:PORT/)\n", scheme, a, scheme, cfg.Domain)
			}
			if a := s.SSHAddr(); a != "" {
				fmt.Fprintf(os.Stderr, "ssh gateway on %s (ssh -p PORT VM@HOST, password: a token)\n", a)
			}
			if !noWarm {
				go func() {
					if err := s.Warm(cmd.Context(), warmImages, 1, 1024); err != nil {
						cfg.Log.Error("warming the templates failed", "err", err)
					}
				}()
			}
			return s.Serve(cmd.Context())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", server.DefaultDataDir(), "data directory (env AGENTVM_DATA_DIR)")
	// No default from the environment here: cobra prints defaults in --help,
	// and the URL may hold a password (read in RunE instead).
	f.StringVar(&cfg.Store, "store", "", "metadata database (env AGENTVM_STORE): a SQLite file path, sqlite:PATH or a PostgreSQL URL postgres://USER@HOST:PORT/DB?sslmode=... (the password from PGPASSWORD or ~/.pgpass, or in the URL; default: agentvm.db in the data dir)")
	f.StringVar(&cfg.Listen, "listen", envOr("AGENTVM_LISTEN", "127.0.0.1:7070"), "API listen address")
	f.StringVar(&cfg.Accel, "accel", envOr("AGENTVM_ACCEL", "auto"), "accelerator: auto, kvm or tcg")
	f.StringVar(&cfg.CacheDir, "cache-dir", image.DefaultCacheDir(), "image and template cache (env AGENTVM_CACHE_DIR)")
	f.StringVar(&cfg.TemplateDir, "template-dir", os.Getenv("AGENTVM_TEMPLATE_DIR"), "template snapshots (default <cache-dir>/templates)")
	f.StringVar(&cfg.QEMU, "qemu", envOr("AGENTVM_QEMU", "qemu-system-x86_64"), "QEMU binary")
	f.StringVar(&cfg.AgentPath, "guest-agent", os.Getenv("AGENTVM_GUEST_AGENT"), "agentvm-guest binary to bake into the image (default: next to agentvm)")
	f.BoolVar(&cfg.AllowPrivateEgress, "allow-private-egress", false, "let VMs reach private and link-local addresses and this host (unsafe; loopback and agentvm's own listeners stay denied)")
	f.BoolVar(&cfg.KeepRunning, "keep-running", false, "leave VMs running when the server stops (default: suspend them and wake them at the next start)")
	f.IntVar(&cfg.WarmPool, "warm-pool", 1, "ready VMs kept per recently created shape, so creates skip the restore (0 disables)")
	f.StringVar(&cfg.SSHListen, "ssh-listen", envOr("AGENTVM_SSH_LISTEN", "127.0.0.1:2222"), `SSH gateway address ("" disables it)`)
	f.BoolVar(&cfg.KSM, "ksm", os.Getenv("AGENTVM_KSM") == "1", "merge equal pages of the VMs' memory (turns the host's KSM on; costs CPU, and lets tenants probe each other's pages by timing; env AGENTVM_KSM=1)")
	f.StringVar(&cfg.ProxyListen, "proxy-listen", envOr("AGENTVM_PROXY_LISTEN", "127.0.0.1:7080"), `preview proxy address ("" disables it)`)
	f.StringVar(&cfg.Domain, "domain", envOr("AGENTVM_DOMAIN", "localhost"), "preview host suffix: http://<port>-<vm>.<domain>/")
	f.StringVar(&cfg.E2BDomain, "e2b-domain", envOr("AGENTVM_E2B_DOMAIN", ""), "the domain E2B sandboxes report (default: the preview domain and the proxy's port, e.g. localhost:7080)")
	f.StringVar(&tlsMode, "tls", os.Getenv("AGENTVM_TLS"), "auto: serve previews (and E2B's envd) over HTTPS with a wildcard certificate for *.<domain> from a local CA in the data dir (agentvm ca prints it)")
	f.StringVar(&cfg.TLSCert, "tls-cert", os.Getenv("AGENTVM_TLS_CERT"), "PEM certificate (e.g. a wildcard for *.<domain>) for HTTPS previews")
	f.StringVar(&cfg.TLSKey, "tls-key", os.Getenv("AGENTVM_TLS_KEY"), "PEM key of --tls-cert")
	f.StringSliceVar(&warmImages, "warm-images", splitList(envOr("AGENTVM_WARM_IMAGES", image.Default)), "images whose template (and warm pool) are made at start-up: "+strings.Join(image.Names(), ", "))
	f.StringVar(&cfg.StateFormat, "state-format", envOr("AGENTVM_STATE_FORMAT", vm.StateFormatAuto),
		"how saves write a VM's memory: auto (suspends as one migration stream, snapshots and forks as pages, whose sparse RAM file the VMs made from them map copy-on-write and share), mapped-ram (as auto, but suspends with QEMU's mapped-ram, whose wake reads only the pages the file holds: QEMU 9.0 and later, a stream before and on a cluster node with --objects), pages or stream for every save; states of any format restore")
	f.BoolVar(&cfg.Cluster, "cluster", os.Getenv("AGENTVM_CLUSTER") != "", "be a node of the cluster whose database is --store (PostgreSQL): join it, run only the VMs recorded on this node, renew a lease and kill every VM of this node when the lease cannot be renewed in time (agentvm node ls lists the nodes)")
	f.StringVar(&cfg.NodeName, "node-name", os.Getenv("AGENTVM_NODE_NAME"), "this node's name in the cluster (default: the host name)")
	f.StringVar(&cfg.Advertise, "advertise", os.Getenv("AGENTVM_ADVERTISE"), "the address clients reach this node's API at (default: --listen's)")
	f.StringVar(&cfg.PeerListen, "peer-listen", os.Getenv("AGENTVM_PEER_LISTEN"), "with --cluster: the node-to-node listener other nodes forward requests to, TLS with the cluster CA's certificates both ways (default 127.0.0.1:0; listen on an address the other nodes reach, e.g. 0.0.0.0:7071, whose host part is then --advertise's)")
	f.StringVar(&cfg.Objects, "objects", os.Getenv("AGENTVM_OBJECTS"), "keep snapshots in an S3-compatible object store too, s3://BUCKET[/PREFIX][?endpoint=http://HOST:PORT&region=R] (keys from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; endpoint default AWS_ENDPOINT_URL or AWS): any node of a cluster with the same QEMU and accelerator then restores them, also after their node is lost")
	f.DurationVar(&cfg.LeaseTTL, "lease", 0, "the node's lease in the cluster (default 15s): renewed every third of it; the node kills its VMs a quarter of it before a lease it could not renew may run out")
	f.StringVar(&recordMax, "record-max", envOr("AGENTVM_RECORD_MAX", "64M"), "the most each VM's terminal and exec recordings may hold; past it the oldest go, and a recording that alone exceeds it is cut (env AGENTVM_RECORD_MAX)")
	f.DurationVar(&cfg.RecordRetention, "record-retention", 30*24*time.Hour, "how long recordings are kept")
	f.StringVar(&gitMaxPush, "git-max-push", envOr("AGENTVM_GIT_MAX_PUSH", "1G"), "the most one push to a hosted repository may send (git's receive.maxInputSize), e.g. 200M (env AGENTVM_GIT_MAX_PUSH)")
	f.StringVar(&memBudget, "memory-budget", envOr("AGENTVM_MEMORY_BUDGET", "1G"), "the most that requests may hold in the daemon's memory at once, across all tokens (buffered exec output, screenshots), e.g. 512M or 2G; past it they are refused with 503 or keep less, saying why (0 or off: unlimited)")
	f.BoolVar(&noWarm, "no-warm", os.Getenv("AGENTVM_NO_WARM") != "", "do not build the templates of --warm-images at start-up")
	return c
}

func imageCmd() *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Manage the guest images (" + strings.Join(image.Names(), ", ") + ")"}
	var o image.Options
	build := &cobra.Command{
		Use:   "build",
		Short: "Build (or rebuild) a Debian guest image (--name, default: the default image)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.AgentPath == "" {
				exe, _ := os.Executable()
				o.AgentPath = exe[:len(exe)-len("agentvm")] + "agentvm-guest"
			}
			o.Progress = func(step string) { fmt.Fprintln(os.Stderr, "==>", step) }
			img, err := image.Ensure(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Printf("image %s %s\n  kernel %s\n  initrd %s\n  disk   %s\n", img.Name, img.Hash, img.Kernel, img.Initrd, img.Disk)
			return nil
		},
	}
	build.Flags().StringVar(&o.CacheDir, "cache-dir", image.DefaultCacheDir(), "image cache")
	build.Flags().StringVar(&o.AgentPath, "guest-agent", os.Getenv("AGENTVM_GUEST_AGENT"), "agentvm-guest binary (default: next to agentvm)")
	build.Flags().BoolVar(&o.Force, "force", true, "rebuild even if cached")
	build.Flags().StringVar(&o.Name, "name", image.Default, "image: "+strings.Join(image.Names(), ", "))
	c.AddCommand(build)
	return c
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
