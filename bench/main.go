// Command bench measures agentvm end to end on this host: the template cold boot,
// create-to-first-exec, exec round trips (SDK buffered, SDK streaming, CLI) and a
// baseline of OpenSSH into the same VM through the daemon's TCP tunnel.
//
// Run from the repository root:
//
//	go run ./bench [-creates 10] [-execs 50] [-cli-execs 20] [-keep-template] [-json out.json]
//	go run ./bench -lifecycle [-lc-runs 3] [-lc-memories 1024,4096] [-lc-detail] [-json out.json]  # the issue 15 table: wake, create --from, fork, suspend, live grow, creates with and without the warm pool, fork parent pause idle and dirtying, each as a ratio to a cold boot in the same run (lifecycle_table.go); -lc-detail adds pause/resume, snapshot, fork 1/4/8, vCPU hot-add (lifecycle.go)
//	go run ./bench -restore [-json out.json]     # restores of a VM's own memory, stream vs pages format, 1 and 4 GiB (restore.go)
//	go run ./bench -e2b [-creates 10] [-execs 50]  # the published e2b npm SDK vs the Go client (e2b.go)
//	go run ./bench -tssdk [-execs 50]  # exec round trip through sdk/typescript vs the Go client (tssdk.go)
//	go run ./bench -stress [-stress-vms 50] [-stress-suspended 200]  # parallel creates/execs, memory and idle CPU per VM, list and wake of many suspended (stress.go)
//	go run ./bench -browser [-creates 10] [-execs 50]  # browser image: create to CDP, screenshots, fork with an open page (browser.go)
//	go run ./bench -memory  # daemon RSS under parallel buffered execs and screenshots, default --memory-budget vs off (memory.go)
//	go run ./bench -crashloop [-crashloop-creates 500]  # creates in a loop on the distribution's QEMU and AGENTVM_QEMU: restores that crashed, creates that failed (crashloop.go)
//	go run ./bench -compare REV  # before/after: create, exec, fork, an E2B commands.run and a preview request, p50 on SQLite and PostgreSQL, this tree against git revision REV (compare.go)
//	go run ./bench -memgrow  # live memory grow of a running VM, 1 GiB -> 4 GiB, against stop/resize/start (memgrow.go)
//
// It builds the binaries into a temp dir, starts its own `agentvm serve` on a fresh
// data dir (and a fresh template dir unless -keep-template), and deletes every VM it
// created before stopping the server, also on error or Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

type options struct {
	creates      int
	execs        int
	cliExecs     int
	sshNew       int
	sshCM        int
	keepTemplate bool
	skipSSH      bool
	jsonPath     string
	verbose      bool
	lifecycle    bool
	restore      bool
	access       bool
	net          bool
	stress       bool
	e2b          bool
	tssdk        bool
	pysdk        bool
	cluster      bool
	code         bool
	browser      bool
	memgrow      bool
	templates    bool
	git          bool
	record       bool
	diff         bool
	memory       bool
	crashLoop    bool
	compare      string
}

func main() {
	var o options
	flag.IntVar(&o.creates, "creates", 10, "sequential creates measured for create-to-first-exec")
	flag.IntVar(&o.execs, "execs", 50, "exec round trips per SDK path")
	flag.IntVar(&o.cliExecs, "cli-execs", 20, "exec round trips through the CLI binary")
	flag.IntVar(&o.sshNew, "ssh-new", 10, "ssh calls with a new connection each")
	flag.IntVar(&o.sshCM, "ssh-cm", 30, "ssh calls over a ControlMaster connection")
	flag.BoolVar(&o.keepTemplate, "keep-template", false, "reuse the cached template (no cold boot is measured)")
	flag.BoolVar(&o.skipSSH, "skip-ssh", false, "skip the OpenSSH baseline")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this path")
	flag.BoolVar(&o.verbose, "v", false, "print progress details")
	flag.BoolVar(&o.lifecycle, "lifecycle", false, "run only the lifecycle benchmark (the issue 15 table for -lc-memories VMs against a cold boot measured on a server with an empty template dir; -lc-detail adds pause/resume, suspend, snapshot, fork on one -lc-memory VM); implies -keep-template unless it is given")
	flag.BoolVar(&o.access, "access", false, "run only the interactive-access benchmark (100 MiB through the files API and scp via the gateway vs scp to sshd in the VM, keystroke echo); implies -keep-template unless it is given")
	flag.BoolVar(&o.net, "net", false, "run only the networking benchmark (preview proxy vs plain TCP exposure, VM -> host loopback throughput); implies -keep-template unless it is given")
	flag.BoolVar(&o.stress, "stress", false, "run only the stress benchmark (parallel creates and execs, create latency and host memory as running VMs pile up to -stress-vms, suspend/list/wake of all); implies -keep-template unless it is given")
	flag.BoolVar(&o.e2b, "e2b", false, "run only the E2B benchmark (the published e2b npm SDK vs agentvm's Go client: create-to-first-command and a command round trip); implies -keep-template unless it is given")
	flag.BoolVar(&o.tssdk, "tssdk", false, "run only the TypeScript SDK benchmark (exec round trip of true through sdk/typescript vs the Go client, same VM); implies -keep-template unless it is given")
	flag.BoolVar(&o.pysdk, "pysdk", false, "run only the Python SDK benchmark (exec round trip of true through sdk/python, sync and async, vs the Go client, and an OpenAI Agents SDK exec_command tool call through agentvm's provider, same VM); implies -keep-template unless it is given")
	flag.BoolVar(&o.code, "code", false, "run only the code-interpreter benchmark (run_code print(1) vs exec true on one VM, create to first result from the template and the warm pool, and per language (Python, JavaScript, TypeScript, R, Java, bash) 1+1 vs Python's and create to its first result from the warm pool); implies -keep-template unless it is given")
	flag.BoolVar(&o.browser, "browser", false, "run only the browser benchmark (create to a CDP answer from the template and the warm pool vs a Chromium start, screenshots vs CDP's, fork of a VM with an open page vs a default fork); implies -keep-template unless it is given")
	flag.BoolVar(&o.cluster, "cluster", false, "run only the cluster benchmark (create p50 on 1, 2 and 3 nodes of a cluster on a PostgreSQL the run starts, against this run's single-node server; exec of true sent to its VM's node vs to another node, which forwards it); implies -keep-template unless it is given")
	flag.BoolVar(&o.memgrow, "memgrow", false, "run only the live memory grow benchmark (resize of a running 1 GiB VM to 4 GiB until the guest's MemTotal shows it, against stop/resize/start); implies -keep-template unless it is given")
	flag.BoolVar(&o.memory, "memory", false, "run only the memory benchmark (daemon RSS under 8 parallel buffered execs of 16 MiB of NULs and 8 parallel screenshots of a 4096x4096 framebuffer, default --memory-budget against off); implies -keep-template unless it is given")
	flag.BoolVar(&o.crashLoop, "crashloop", false, "run only the restore crash loop (-crashloop-creates creates from the template, each deleted at once, on the distribution's QEMU and on AGENTVM_QEMU, counting restores whose QEMU crashed and creates that failed); implies -keep-template unless it is given")
	flag.BoolVar(&o.templates, "templates", false, "run only the template benchmark (a Dockerfile's full build against a rebuild with its last step changed and one with every step cached; create from the template until its service answers HTTP against a boot of the same machine from disk); implies -keep-template unless it is given")
	flag.BoolVar(&o.git, "git", false, "run only the hosted-git benchmark (push and clone of a 100 MiB repository through /git/ against git over ssh to the host's sshd on the same disk; needs openssh-server)")
	flag.BoolVar(&o.diff, "diff", false, "run only the diff benchmark (agentvm diff of a VM with 10,000 files written, running and suspended, against a VM just made); implies -keep-template unless it is given")
	flag.BoolVar(&o.record, "record", false, "run only the recording benchmark (a terminal printing 50 MiB with the VM's recording on and off); implies -keep-template unless it is given")
	flag.IntVar(&crashLoopCreates, "crashloop-creates", 500, "creates per QEMU for -crashloop")
	flag.IntVar(&stressVMs, "stress-vms", 50, "VMs running at the end of -stress")
	flag.IntVar(&stressSuspended, "stress-suspended", 200, "suspended VMs listed and woken one by one at the end of -stress (more are created, and suspended, past -stress-vms)")
	flag.Int64Var(&lcMemoryMiB, "lc-memory", 1024, "VM memory in MiB for -lifecycle")
	flag.BoolVar(&o.restore, "restore", false, "run only the restore benchmark (suspend, wake, create --from a snapshot, fork 1/2/8, on 1 GiB and 4 GiB VMs, with the state saved as a stream and as a mapped RAM file: one server per --state-format); implies -keep-template unless it is given")
	flag.StringVar(&o.compare, "compare", "", "run only the before/after benchmark against this git revision (built in the run): create, exec, fork, an E2B commands.run and a preview request, p50 on SQLite and on PostgreSQL, with ratios to the revision's; implies -keep-template unless it is given")
	flag.Parse()
	if o.compare != "" || o.lifecycle || o.restore || o.access || o.net || o.stress || o.e2b || o.code || o.tssdk || o.pysdk || o.browser || o.memgrow || o.cluster || o.memory || o.crashLoop || o.templates || o.git || o.record || o.diff {
		explicit := false
		flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "keep-template" })
		if !explicit {
			o.keepTemplate = true
		}
	}
	if o.creates < 1 || o.execs < 1 || o.cliExecs < 1 || o.sshNew < 1 || o.sshCM < 1 {
		fmt.Fprintln(os.Stderr, "bench: iteration counts must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A second signal during cleanup is swallowed on purpose: VMs must be deleted.
	code := run(ctx, o)
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, o options) (code int) {
	root, err := repoRoot()
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "agentvm-bench-")
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	r := &Report{StartedAt: time.Now().UTC()}
	r.Config = Config{Creates: o.creates, Execs: o.execs, CLIExecs: o.cliExecs, SSHNew: o.sshNew, SSHCM: o.sshCM,
		KeepTemplate: o.keepTemplate, MemoryMiB: vmMemory >> 20, DiskGiB: vmDisk >> 30}
	r.Host = hostFacts()

	logf("building agentvm and agentvm-guest")
	bin, err := buildBinaries(ctx, root, tmp)
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	logf("making sure the guest image is cached (not measured)")
	if err := ensureImage(ctx, bin); err != nil {
		logf("error: %v", err)
		return 1
	}
	var extra []string
	if o.record {
		// The flood's whole recording (~80 MiB of JSON) fits: no cut.
		extra = append(extra, "--record-max", "1G")
	}
	srv, err := startServer(ctx, bin, tmp, o.keepTemplate, 0, extra...)
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	b := &bench{o: o, srv: srv, c: srv.client, r: r, tmp: tmp, vms: map[string]int{}}
	defer func() {
		if p := recover(); p != nil {
			logf("panic: %v", p)
			code = 1
		}
		b.cleanup()
		if err := srv.stop(); err != nil {
			logf("stopping the server: %v", err)
		}
		srv.removeRunDir()
		if code != 0 {
			logf("server log tail:\n%s", srv.logTail(4000))
			if o.lifecycle {
				p := filepath.Join(os.TempDir(), "agentvm-bench-lifecycle-server-"+time.Now().Format("150405")+".log")
				if os.WriteFile(p, []byte(srv.log.String()), 0o644) == nil {
					logf("full server log: %s", p)
				}
			}
		}
	}()
	logf("server %s (data %s, templates %s)", srv.url, srv.dataDir, srv.templateDir)

	phases := b.runAll
	if o.access {
		phases = b.runAccess
	}
	if o.net {
		phases = b.runNet
	}
	if o.stress {
		phases = b.runStress
	}
	if o.e2b {
		phases = b.runE2B
	}
	if o.tssdk {
		phases = b.runTSSDK
	}
	if o.pysdk {
		phases = b.runPySDK
	}
	if o.code {
		phases = b.runCode
	}
	if o.browser {
		phases = b.runBrowser
	}
	if o.memgrow {
		phases = b.runMemGrow
	}
	if o.templates {
		phases = b.runTemplates
	}
	if o.memory {
		phases = b.runMemory
	}
	if o.git {
		phases = b.runGit
	}
	if o.record {
		phases = b.runRecord
	}
	if o.diff {
		phases = b.runDiff
	}
	if o.crashLoop {
		phases = b.runCrashLoop
	}
	if o.restore {
		phases = b.runRestore
	}
	if o.cluster {
		phases = b.runCluster
	}
	if o.compare != "" {
		phases = b.runCompare
	}
	if o.lifecycle {
		phases = b.runLifecycle
		r.Config.MemoryMiB, r.Config.DiskGiB = lcMemoryMiB, 0
		r.Notes = append(r.Notes, lifecycleNotes()...)
	}
	if err := phases(ctx); err != nil {
		r.Errors = append(r.Errors, err.Error())
		logf("error: %v", err)
		code = 1
		if errors.Is(ctx.Err(), context.Canceled) {
			logf("interrupted; cleaning up")
			return code
		}
	}
	r.FinishedAt = time.Now().UTC()
	var out any = r
	switch {
	case o.restore:
		// runRestore printed its table; the JSON carries it in the notes.
		out = modeJSON(r, "notes", r.Notes)
	case o.net:
		r.PrintNet(os.Stdout)
		out = modeJSON(r, "net", r.Net)
	case o.access:
		r.PrintAccess(os.Stdout)
		out = modeJSON(r, "access", r.Access)
	case o.e2b:
		r.PrintE2B(os.Stdout)
		out = modeJSON(r, "e2b", r.E2B)
	case o.code:
		r.PrintCode(os.Stdout)
		out = modeJSON(r, "code", r.Code)
	case o.templates:
		r.PrintTemplates(os.Stdout)
		out = modeJSON(r, "templates", r.Templates)
	case o.git:
		r.PrintGit(os.Stdout)
		out = modeJSON(r, "git", r.Git)
	case o.record:
		r.PrintRecord(os.Stdout)
		out = modeJSON(r, "record", r.Record)
	case o.diff:
		r.PrintDiff(os.Stdout)
		out = modeJSON(r, "diff", r.Diff)
	case o.memgrow:
		r.PrintMemGrow(os.Stdout)
		out = modeJSON(r, "memgrow", r.MemGrow)
	case o.memory:
		r.PrintMemory(os.Stdout)
		out = modeJSON(r, "memory", r.Memory)
	case o.crashLoop:
		r.PrintCrashLoop(os.Stdout)
		out = modeJSON(r, "crashloop", r.CrashLoop)
	case o.browser:
		r.PrintBrowser(os.Stdout)
		out = modeJSON(r, "browser", r.Browser)
	case o.compare != "":
		r.PrintCompare(os.Stdout)
		out = modeJSON(r, "compare", r.Compare)
	case o.cluster:
		r.PrintCluster(os.Stdout)
		out = modeJSON(r, "cluster", r.Cluster)
	case o.tssdk:
		r.PrintTSSDK(os.Stdout)
		out = modeJSON(r, "tssdk", r.TSSDK)
	case o.pysdk:
		r.PrintPySDK(os.Stdout)
		out = modeJSON(r, "pysdk", r.PySDK)
	case o.stress:
		r.PrintStress(os.Stdout)
		out = modeJSON(r, "stress", r.Stress)
	case o.lifecycle:
		if r.Lifecycle != nil {
			r.Lifecycle.computeRatios()
		}
		r.PrintLifecycle(os.Stdout)
		out = lifecycleJSON{StartedAt: r.StartedAt, FinishedAt: r.FinishedAt, Host: r.Host, Lifecycle: r.Lifecycle, Notes: r.Notes, Errors: r.Errors}
	default:
		r.computeRatios()
		r.Print(os.Stdout)
	}
	if o.jsonPath != "" {
		bs, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(bs, '\n'), 0o644); err != nil {
			logf("write %s: %v", o.jsonPath, err)
			code = 1
		} else {
			logf("wrote %s", o.jsonPath)
		}
	}
	return code
}

// runAll runs the phases in order. A failing phase is recorded; later phases that
// do not depend on it still run.
func (b *bench) runAll(ctx context.Context) error {
	h, err := b.c.Health(ctx)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	b.r.Host.Accel = h.Accel
	b.r.Host.ServerVersion = h.Version

	if err := b.coldBoot(ctx); err != nil {
		return fmt.Errorf("cold boot: %w", err)
	}
	if err := b.createLoop(ctx); err != nil {
		return fmt.Errorf("create loop: %w", err)
	}
	if err := b.poolLoop(ctx); err != nil {
		return fmt.Errorf("warm pool loop: %w", err)
	}
	vm, err := b.create(ctx)
	if err != nil {
		return fmt.Errorf("create the exec/ssh VM: %w", err)
	}
	logf("exec benchmarks on %s", vm)
	if err := b.execBench(ctx, vm); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if b.o.skipSSH {
		b.r.SSH.Error = "skipped (-skip-ssh)"
		return nil
	}
	if err := b.sshBench(ctx, vm); err != nil {
		b.r.SSH.Error = err.Error()
		b.r.Errors = append(b.r.Errors, "ssh: "+err.Error())
		logf("ssh baseline failed: %v", err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// repoRoot finds the module root (the directory holding go.mod) from the working dir.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "cmd", "agentvm")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the agentvm repository (no go.mod with cmd/agentvm found)")
		}
		dir = parent
	}
}

func hostFacts() Host {
	h := Host{NProc: runtime.NumCPU(), GoVersion: runtime.Version()}
	h.QEMUVersion = qemuVersion()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		h.LoadAvgAtStart = trimLine(string(b))
	}
	return h
}

// modeJSON is the JSON of a run of one mode: when it ran, on what host, the
// mode's report under key, and the errors.
func modeJSON(r *Report, key string, report any) map[string]any {
	m := map[string]any{"started_at": r.StartedAt, "finished_at": r.FinishedAt, "host": r.Host, key: report}
	if len(r.Errors) > 0 {
		m["errors"] = r.Errors
	}
	return m
}
