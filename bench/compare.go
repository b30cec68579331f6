package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/pkg/client"
)

// The compare benchmark (issue 29's before/after): one workload on this
// tree's agentvm and on a baseline revision's, both built in the same run,
// on SQLite and on PostgreSQL (a one-node cluster on a PostgreSQL the run
// starts, listening to the database as every cluster node does): create
// (to a first exec), exec of `true`, a fork of one child, an E2B
// commands.run('true') through the published SDK, and a preview request,
// each a p50 in ms with its ratio to the baseline's. Servers run one at a
// time (baseline first, then this tree), each on a fresh data dir (and a
// fresh database) with the cached template.

// CompareRun is one server's figures.
type CompareRun struct {
	Backend string `json:"backend"` // sqlite or postgres
	Build   string `json:"build"`   // baseline or head
	Create  Stats  `json:"create_to_first_exec"`
	Exec    Stats  `json:"exec_true"`
	Fork    Stats  `json:"fork_one_child"`
	E2BRun  Stats  `json:"e2b_commands_run_true"`
	Preview Stats  `json:"preview_get"`
}

// CompareReport is the result of -compare.
type CompareReport struct {
	Baseline string       `json:"baseline"`
	Runs     []CompareRun `json:"runs"`
}

const (
	compareCreates = 8
	compareForks   = 8
	comparePreview = 50
)

func (b *bench) runCompare(ctx context.Context) error {
	rep := &CompareReport{Baseline: b.o.compare}
	b.r.Compare = rep
	root, err := repoRoot()
	if err != nil {
		return err
	}
	head := filepath.Dir(b.srv.cmd.Path)
	logf("building the baseline %s", b.o.compare)
	src := filepath.Join(b.tmp, "baseline-src")
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "worktree", "add", "--detach", src, b.o.compare).CombinedOutput(); err != nil {
		return fmt.Errorf("git worktree add %s: %v: %s", b.o.compare, err, out)
	}
	defer exec.Command("git", "-C", root, "worktree", "remove", "--force", src).Run()
	base, err := buildBinaries(ctx, src, filepath.Join(b.tmp, "baseline"))
	if err != nil {
		return err
	}
	if err := ensureImage(ctx, base); err != nil {
		return err
	}
	web, err := b.buildWebsrv(ctx)
	if err != nil {
		return err
	}
	npmDir, err := b.installE2B(ctx)
	if err != nil {
		return err
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	defer pg.Stop()

	for _, backend := range []string{"sqlite", "postgres"} {
		for _, build := range []struct{ name, bin string }{{"baseline", base}, {"head", head}} {
			dir := filepath.Join(b.tmp, "compare-"+backend+"-"+build.name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			var extra []string
			if backend == "postgres" {
				dsn, err := pg.NewDatabase(ctx)
				if err != nil {
					return err
				}
				extra = []string{"--store", dsn, "--cluster", "--node-name", "compare"}
			}
			logf("%s, %s: starting its server", backend, build.name)
			srv, err := startServer(ctx, build.bin, dir, true, 0, extra...)
			if err != nil {
				return fmt.Errorf("%s %s server: %w", backend, build.name, err)
			}
			run, err := compareWorkload(ctx, srv, web, npmDir)
			deleteAll(context.Background(), srv.client)
			if serr := srv.stop(); serr != nil {
				logf("stopping the server: %v", serr)
			}
			srv.removeRunDir()
			if err != nil {
				return fmt.Errorf("%s %s: %w", backend, build.name, err)
			}
			run.Backend, run.Build = backend, build.name
			rep.Runs = append(rep.Runs, run)
			logf("%s, %s: create %.0f, exec %.1f, fork %.0f, e2b run %.1f, preview %.1f ms (p50)",
				backend, build.name, run.Create.P50, run.Exec.P50, run.Fork.P50, run.E2BRun.P50, run.Preview.P50)
		}
	}
	return nil
}

// buildWebsrv builds the e2e suite's small web server for the preview.
func (b *bench) buildWebsrv(ctx context.Context) (string, error) {
	root, _ := repoRoot()
	bin := filepath.Join(b.tmp, "websrv")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./e2e/testdata/websrv")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build websrv: %v: %s", err, out)
	}
	return bin, nil
}

// installE2B installs the pinned e2b npm package and the script of the
// E2B benchmark (e2b.go) into a directory of the run.
func (b *bench) installE2B(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", fmt.Errorf("npm is needed to install %s", e2bPackage)
	}
	dir := filepath.Join(b.tmp, "e2bjs")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private":true,"type":"module"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "bench.mjs"), []byte(e2bScript), 0o644)
	logf("installing %s (not measured)", e2bPackage)
	inst := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", e2bPackage)
	inst.Dir = dir
	if out, err := inst.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install %s: %v\n%s", e2bPackage, err, out)
	}
	return dir, nil
}

// compareWorkload measures one server.
func compareWorkload(ctx context.Context, srv *server, websrv, npmDir string) (CompareRun, error) {
	var run CompareRun
	c := srv.client
	h, err := c.Health(ctx)
	if err != nil || h.Proxy == "" {
		return run, fmt.Errorf("health (a preview proxy is needed): %v", err)
	}
	var create []float64
	var vm *api.VM
	for i := 0; i < compareCreates; i++ {
		t0 := time.Now()
		v, err := c.CreateVM(ctx, vmShape)
		if err != nil {
			return run, err
		}
		if _, err := c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return run, err
		}
		create = append(create, millis(time.Since(t0)))
		if vm == nil {
			vm = v
		} else if err := c.DeleteVM(ctx, v.ID); err != nil {
			return run, err
		}
	}
	run.Create = summarize(create)

	var execs []float64
	for i := 0; i < 3+50; i++ {
		t0 := time.Now()
		r, err := c.Exec(ctx, vm.ID, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		if err != nil {
			return run, err
		}
		if i >= 3 {
			execs = append(execs, millis(time.Since(t0)))
		}
	}
	run.Exec = summarize(execs)

	var forks []float64
	for i := 0; i < compareForks; i++ {
		t0 := time.Now()
		f, err := c.Fork(ctx, vm.ID, 1)
		if err != nil {
			return run, err
		}
		forks = append(forks, millis(time.Since(t0)))
		for _, ch := range f.Children {
			if err := c.DeleteVM(ctx, ch.ID); err != nil {
				return run, err
			}
		}
	}
	run.Fork = summarize(forks)

	if run.Preview, err = previewP50(ctx, c, vm, h, websrv); err != nil {
		return run, fmt.Errorf("preview: %w", err)
	}
	if run.E2BRun, err = e2bRunP50(ctx, srv, h, npmDir); err != nil {
		return run, fmt.Errorf("e2b: %w", err)
	}
	return run, nil
}

// previewP50 serves a page from vm on a public preview and times GETs of it
// through the preview proxy.
func previewP50(ctx context.Context, c *client.Client, vm *api.VM, h *api.Health, websrv string) (Stats, error) {
	f, err := os.Open(websrv)
	if err != nil {
		return Stats{}, err
	}
	fi, _ := f.Stat()
	_, err = c.WriteFile(ctx, vm.ID, "/usr/local/bin/websrv", f, fi.Size(), client.WriteOptions{Mode: 0o755})
	f.Close()
	if err != nil {
		return Stats{}, err
	}
	r, err := c.Exec(ctx, vm.ID, api.ExecRequest{Shell: "nohup /usr/local/bin/websrv :8000 >/tmp/websrv.log 2>&1 & for i in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"})
	if err != nil || r.ExitCode != 0 {
		return Stats{}, fmt.Errorf("start websrv: %v %+v", err, r)
	}
	if _, err := c.Expose(ctx, vm.ID, api.ExposeRequest{Port: 8000, Public: true}); err != nil {
		return Stats{}, err
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	var lat []float64
	for i := 0; i < 5+comparePreview; i++ {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+h.Proxy+"/", nil)
		req.Host = fmt.Sprintf("8000-%s.%s", vm.Name, h.Domain)
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return Stats{}, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return Stats{}, fmt.Errorf("GET through the proxy: %s", resp.Status)
		}
		if i >= 5 {
			lat = append(lat, millis(time.Since(t0)))
		}
	}
	return summarize(lat), nil
}

// e2bRunP50 times commands.run('true') through the published e2b SDK on a
// sandbox of its own.
func e2bRunP50(ctx context.Context, srv *server, h *api.Health, npmDir string) (Stats, error) {
	key, err := srv.client.CreateToken(ctx, api.CreateTokenRequest{E2B: true})
	if err != nil {
		return Stats{}, err
	}
	_, port, _ := strings.Cut(h.Proxy, ":")
	cmd := exec.CommandContext(ctx, "node", "bench.mjs", "1", "50")
	cmd.Dir = npmDir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key.Secret, "E2B_API_URL="+srv.url,
		"E2B_SANDBOX_URL=http://"+h.Proxy, "E2B_DOMAIN="+h.Domain+":"+port)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return Stats{}, fmt.Errorf("e2b bench script: %v", err)
	}
	var res struct {
		Run []float64 `json:"run_ms"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return Stats{}, fmt.Errorf("e2b bench script output %q: %v", out, err)
	}
	return summarize(res.Run), nil
}

// PrintCompare prints the p50s side by side with their ratios (head /
// baseline: below 1 is faster).
func (r *Report) PrintCompare(w io.Writer) {
	c := r.Compare
	if c == nil {
		return
	}
	fmt.Fprintf(w, "\nagentvm before/after (-compare %s), p50 in ms, head/baseline\n", c.Baseline)
	runs := map[string]CompareRun{}
	for _, run := range c.Runs {
		runs[run.Backend+"/"+run.Build] = run
	}
	fmt.Fprintf(w, "  %-32s %10s %10s %7s   %10s %10s %7s\n", "", "SQLite", "", "", "PostgreSQL", "", "")
	fmt.Fprintf(w, "  %-32s %10s %10s %7s   %10s %10s %7s\n", "", "baseline", "head", "ratio", "baseline", "head", "ratio")
	for _, row := range []struct {
		name string
		get  func(CompareRun) Stats
	}{
		{"create to first exec", func(r CompareRun) Stats { return r.Create }},
		{"exec true", func(r CompareRun) Stats { return r.Exec }},
		{"fork, one child", func(r CompareRun) Stats { return r.Fork }},
		{"e2b commands.run('true')", func(r CompareRun) Stats { return r.E2BRun }},
		{"preview GET", func(r CompareRun) Stats { return r.Preview }},
	} {
		fmt.Fprintf(w, "  %-32s", row.name)
		for _, be := range []string{"sqlite", "postgres"} {
			b, okb := runs[be+"/baseline"]
			h, okh := runs[be+"/head"]
			if !okb || !okh {
				fmt.Fprintf(w, " %10s %10s %7s  ", "-", "-", "-")
				continue
			}
			bp, hp := row.get(b).P50, row.get(h).P50
			fmt.Fprintf(w, " %10.1f %10.1f %6.2fx  ", bp, hp, ratio(hp, bp))
		}
		fmt.Fprintln(w)
	}
}
