package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// The TypeScript SDK benchmark: the exec round trip of `true` through the
// SDK in sdk/typescript (built in the run's temp dir and driven by a node
// script) against the Go client, on the same VM in the same run. The two
// take turns in batches, so drifting host conditions hit both alike.

const tsBatches = 5

// tsScript times vm.exec (buffered JSON) and vm.run (upgraded stream with
// stdin) of `true`. It stays up for the whole run, so its code is as warm
// as the Go client's: each line on stdin is a round-trip count, answered by
// one JSON line. argv: SDK module URL, VM id.
const tsScript = `import { createInterface } from 'node:readline'
const { AgentVM } = await import(process.argv[2])
const vm = new AgentVM().vm(process.argv[3])
const exec = async () => { const r = await vm.exec(['true']); if (r.exit_code !== 0) throw new Error('true exited ' + r.exit_code) }
const run = async () => { const r = await vm.run(['true']); if (r.exit_code !== 0) throw new Error('true exited ' + r.exit_code) }
for (let i = 0; i < 3; i++) { await exec(); await run() }
for await (const line of createInterface({ input: process.stdin })) {
  const out = { exec_ms: [], run_ms: [] }
  for (let i = 0; i < Number(line); i++) {
    const [a, b, da, db] = i % 2 ? [run, exec, out.run_ms, out.exec_ms] : [exec, run, out.exec_ms, out.run_ms]
    let t0 = performance.now(); await a(); da.push(performance.now() - t0)
    t0 = performance.now(); await b(); db.push(performance.now() - t0)
  }
  console.log(JSON.stringify(out))
}
`

// TSSDKReport is the result of -tssdk.
type TSSDKReport struct {
	ExecTS    Stats   `json:"exec_true_ts_sdk"`
	ExecGo    Stats   `json:"exec_true_go_client"`
	ExecRatio float64 `json:"exec_ratio"`
	RunTS     Stats   `json:"run_true_ts_sdk"`
	RunGo     Stats   `json:"run_true_go_client"`
	RunRatio  float64 `json:"run_ratio"`
	Batches   int     `json:"batches"`
	Node      string  `json:"node"`
}

func (b *bench) runTSSDK(ctx context.Context) error {
	r := &TSSDKReport{Batches: tsBatches}
	b.r.TSSDK = r
	if _, err := exec.LookPath("npm"); err != nil {
		return fmt.Errorf("tssdk: npm is needed to build sdk/typescript")
	}
	nv, _ := exec.Command("node", "--version").Output()
	r.Node = strings.TrimSpace(string(nv))
	root, err := repoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(b.tmp, "tssdk")
	if err := copyTree(filepath.Join(root, "sdk", "typescript"), dir); err != nil {
		return fmt.Errorf("copy sdk/typescript: %w", err)
	}
	logf("building the TypeScript SDK (npm ci, npm run build; not measured)")
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund", "--loglevel=error"}, {"run", "build"}} {
		cmd := exec.CommandContext(ctx, "npm", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	script := filepath.Join(dir, "bench.mjs")
	if err := os.WriteFile(script, []byte(tsScript), 0o644); err != nil {
		return err
	}
	mod := (&url.URL{Scheme: "file", Path: filepath.Join(dir, "dist", "index.js")}).String()

	id, err := b.create(ctx)
	if err != nil {
		return fmt.Errorf("create the VM: %w", err)
	}
	defer b.remove(id)
	req := api.ExecRequest{Cmd: []string{"true"}}
	goExec := func() error {
		res, err := b.c.Exec(ctx, id, req)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}
	goRun := func() error {
		st, err := b.c.Run(ctx, id, req, nil, io.Discard, io.Discard)
		if err == nil && st.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", st.ExitCode)
		}
		return err
	}
	for i := 0; i < 3; i++ {
		if err := goExec(); err != nil {
			return fmt.Errorf("Go client.Exec (warm-up): %w", err)
		}
		if err := goRun(); err != nil {
			return fmt.Errorf("Go client.Run (warm-up): %w", err)
		}
	}
	per := max(1, b.o.execs/tsBatches)
	var execTS, runTS, execGo, runGo []float64
	goBatch := func() error {
		for i := 0; i < per; i++ {
			first, second, d1, d2 := goExec, goRun, &execGo, &runGo
			if i%2 == 1 {
				first, second, d1, d2 = goRun, goExec, &runGo, &execGo
			}
			t0 := time.Now()
			if err := first(); err != nil {
				return err
			}
			t1 := time.Now()
			if err := second(); err != nil {
				return err
			}
			*d1 = append(*d1, millis(t1.Sub(t0)))
			*d2 = append(*d2, millis(time.Since(t1)))
		}
		return nil
	}
	node, err := b.startScript(ctx, "node bench script", dir, "node", script, mod, id)
	if err != nil {
		return err
	}
	defer node.close()
	tsBatch := func() error {
		var res struct {
			Exec []float64 `json:"exec_ms"`
			Run  []float64 `json:"run_ms"`
		}
		if err := node.batch(per, &res); err != nil {
			return err
		}
		execTS, runTS = append(execTS, res.Exec...), append(runTS, res.Run...)
		return nil
	}
	logf("exec true: %d batches of %d round trips per path, TS SDK and Go client taking turns", tsBatches, per)
	if err := alternate(tsBatches, goBatch, tsBatch); err != nil {
		return err
	}
	r.ExecTS, r.RunTS, r.ExecGo, r.RunGo = summarize(execTS), summarize(runTS), summarize(execGo), summarize(runGo)
	r.ExecRatio, r.RunRatio = ratio(r.ExecTS.P50, r.ExecGo.P50), ratio(r.RunTS.P50, r.RunGo.P50)
	return nil
}

// PrintTSSDK writes the -tssdk report.
func (r *Report) PrintTSSDK(w io.Writer) {
	e := r.TSSDK
	if e == nil {
		return
	}
	fmt.Fprintf(w, "TypeScript SDK (sdk/typescript, node %s) vs the Go client, same VM, same run, %d alternating batches\n", e.Node, e.Batches)
	statsLine(w, "TS vm.exec(['true']) (buffered)", e.ExecTS)
	statsLine(w, "Go client.Exec (buffered)", e.ExecGo)
	ratioLine(w, "TS / Go exec p50 (target <= 1.3)", e.ExecRatio)
	statsLine(w, "TS vm.run(['true']) (stream)", e.RunTS)
	statsLine(w, "Go client.Run (stream)", e.RunGo)
	ratioLine(w, "TS / Go run p50 (target <= 1.3)", e.RunRatio)
}

// copyTree copies a package's sources, leaving out node_modules and dist.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			if rel == "node_modules" || rel == "dist" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		bs, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), bs, 0o644)
	})
}
