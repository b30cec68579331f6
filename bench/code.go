package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// The code-interpreter benchmark: a run of print(1) on a warm context against
// an exec of `true` on the same VM (the baseline), and create of a
// code-interpreter VM to its first result, restored from the template and
// claimed from the warm pool.

// CodeReport is the result of -code.
type CodeReport struct {
	RunPrint     Stats   `json:"run_code_print_1"`
	ExecTrue     Stats   `json:"exec_true_same_vm"`
	RunRatio     float64 `json:"run_ratio"`
	CreateNoPool Stats   `json:"create_to_first_result_template"`
	CreatePool   Stats   `json:"create_to_first_result_warm_pool"`
	CreateExec   Stats   `json:"create_to_first_exec_default_image_template"`
	// Per language: 1+1 on a warm context (ratio to Python's, measured in
	// the same interleaved turns), the first run in a running VM (which
	// starts the context unless it was warm in the template) and create
	// from the warm pool to that language's first result.
	Languages []CodeLanguage `json:"languages"`
}

// CodeLanguage is one language's row of -code.
type CodeLanguage struct {
	Language   string  `json:"language"`
	FirstRun   float64 `json:"first_run_ms"`
	RoundTrip  Stats   `json:"one_plus_one"`
	Ratio      float64 `json:"ratio_to_python"`
	PoolCreate Stats   `json:"create_to_first_result_warm_pool"`
}

// codeLanguages are the languages -code measures, each with its 1+1 and
// the text of its answer.
var codeLanguages = []struct{ lang, code, want string }{
	{"python", "1+1", "2"},
	{"javascript", "1+1", "2"},
	{"typescript", "const a: number = 1; a + 1", "2"},
	{"r", "1+1", "[1] 2"},
	{"java", "1+1", "2"},
	{"bash", "echo $((1+1))", "2\n"},
}

// runLanguage runs one language's 1+1 and checks its answer.
func runLanguage(ctx context.Context, c codeRunner, vm string, i int) error {
	l := codeLanguages[i]
	ex, err := c.RunCode(ctx, vm, api.RunCodeRequest{Language: l.lang, Code: l.code}, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", l.lang, err)
	}
	if ex.Error != nil {
		return fmt.Errorf("%s: %s: %s", l.lang, ex.Error.Name, ex.Error.Value)
	}
	got := ex.Stdout
	for _, r := range ex.Results {
		var s string
		json.Unmarshal(r.Data["text/plain"], &s)
		got += s
	}
	if got != l.want {
		return fmt.Errorf("%s: %q answered %q, want %q", l.lang, l.code, got, l.want)
	}
	return nil
}

type codeRunner interface {
	RunCode(ctx context.Context, id string, req api.RunCodeRequest, onEvent func(api.CodeEvent)) (*client.Execution, error)
}

var codeShape = api.CreateVMRequest{Image: "code-interpreter", Memory: 1 << 30}

func (b *bench) runCode(ctx context.Context) error {
	r := &CodeReport{}
	b.r.Code = r
	logf("code interpreter: first create (builds the image and template when missing; not measured)")
	v, err := b.c.CreateVM(ctx, codeShape)
	if err != nil {
		return err
	}
	b.track(v.ID, v.PID)
	if _, err := b.c.RunCode(ctx, v.ID, api.RunCodeRequest{Code: "1"}, nil); err != nil {
		return err
	}
	var runs, execs []float64
	for i := 0; i < 3+b.o.execs; i++ {
		t0 := time.Now()
		ex, err := b.c.RunCode(ctx, v.ID, api.RunCodeRequest{Code: "print(1)"}, nil)
		if err != nil {
			return err
		}
		if ex.Stdout != "1\n" {
			return fmt.Errorf("print(1) printed %q", ex.Stdout)
		}
		t1 := time.Now()
		if _, err := b.c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		if i >= 3 {
			runs = append(runs, millis(t1.Sub(t0)))
			execs = append(execs, millis(time.Since(t1)))
		}
	}
	r.RunPrint, r.ExecTrue = summarize(runs), summarize(execs)
	if r.ExecTrue.P50 > 0 {
		r.RunRatio = r.RunPrint.P50 / r.ExecTrue.P50
	}
	logf("code interpreter: 1+1 in %d languages, first run then %d interleaved turns", len(codeLanguages), b.o.execs)
	r.Languages = make([]CodeLanguage, len(codeLanguages))
	turns := make([][]float64, len(codeLanguages))
	for i := range codeLanguages {
		t0 := time.Now()
		if err := runLanguage(ctx, b.c, v.ID, i); err != nil {
			return err
		}
		r.Languages[i] = CodeLanguage{Language: codeLanguages[i].lang, FirstRun: millis(time.Since(t0))}
	}
	for n := 0; n < b.o.execs; n++ {
		for i := range codeLanguages {
			t0 := time.Now()
			if err := runLanguage(ctx, b.c, v.ID, i); err != nil {
				return err
			}
			turns[i] = append(turns[i], millis(time.Since(t0)))
		}
	}
	for i := range codeLanguages {
		r.Languages[i].RoundTrip = summarize(turns[i])
		if py := r.Languages[0].RoundTrip.P50; py > 0 {
			r.Languages[i].Ratio = r.Languages[i].RoundTrip.P50 / py
		}
	}
	if err := b.remove(v.ID); err != nil {
		return err
	}

	logf("code interpreter: %d creates to first result from the template", b.o.creates)
	var noPool, plain []float64
	for i := 0; i < b.o.creates; i++ {
		t0 := time.Now()
		v, err := b.c.CreateVM(ctx, codeShape)
		if err != nil {
			return err
		}
		b.track(v.ID, v.PID)
		if _, err := b.c.RunCode(ctx, v.ID, api.RunCodeRequest{Code: "1"}, nil); err != nil {
			return err
		}
		noPool = append(noPool, millis(time.Since(t0)))
		if err := b.remove(v.ID); err != nil {
			return err
		}
		t0 = time.Now()
		d, err := b.c.CreateVM(ctx, api.CreateVMRequest{Memory: 1 << 30})
		if err != nil {
			return err
		}
		b.track(d.ID, d.PID)
		if _, err := b.c.Exec(ctx, d.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		plain = append(plain, millis(time.Since(t0)))
		if err := b.remove(d.ID); err != nil {
			return err
		}
	}
	r.CreateNoPool, r.CreateExec = summarize(noPool), summarize(plain)

	logf("code interpreter: %d creates to first result from the warm pool", b.o.creates)
	srv, err := b.startPoolServer(ctx, "codepool")
	if err != nil {
		return err
	}
	defer srv.stop()
	c := srv.client
	first, err := c.CreateVM(ctx, codeShape) // a miss that starts the refill
	if err != nil {
		return err
	}
	defer c.DeleteVM(context.Background(), first.ID)
	// poolCreates times n creates from the warm pool, each to first(vm)'s end.
	poolCreates := func(n int, first func(vm string) error) (Stats, error) {
		var d []float64
		for i := 0; i < n; i++ {
			if err := waitPool(ctx, c.Health, "code-interpreter/1x1024"); err != nil {
				return Stats{}, err
			}
			t0 := time.Now()
			v, err := c.CreateVM(ctx, codeShape)
			if err != nil {
				return Stats{}, err
			}
			err = first(v.ID)
			d = append(d, millis(time.Since(t0)))
			if err2 := c.DeleteVM(ctx, v.ID); err == nil {
				err = err2
			}
			if err != nil {
				return Stats{}, err
			}
		}
		return summarize(d), nil
	}
	r.CreatePool, err = poolCreates(b.o.creates, func(vm string) error {
		_, err := c.RunCode(ctx, vm, api.RunCodeRequest{Code: "1"}, nil)
		return err
	})
	if err != nil {
		return err
	}
	poolRuns := min(b.o.creates, 3)
	logf("code interpreter: %d creates to first result per language from the warm pool", poolRuns)
	for i := range codeLanguages {
		r.Languages[i].PoolCreate, err = poolCreates(poolRuns, func(vm string) error { return runLanguage(ctx, c, vm, i) })
		if err != nil {
			return err
		}
	}
	return nil
}

// PrintCode writes the -code report.
func (r *Report) PrintCode(w io.Writer) {
	c := r.Code
	if c == nil {
		return
	}
	fmt.Fprintln(w, "Code interpreter (1 vCPU, 1 GiB), same server, same run")
	statsLine(w, "run_code print(1), warm context", c.RunPrint)
	statsLine(w, "exec true, same VM (baseline)", c.ExecTrue)
	ratioLine(w, "ratio p50 (target <= 2)", c.RunRatio)
	statsLine(w, "create -> first result (template)", c.CreateNoPool)
	statsLine(w, "create -> first exec (default image)", c.CreateExec)
	statsLine(w, "create -> first result (warm pool)", c.CreatePool)
	if c.CreatePool.P50 > 0 {
		fmt.Fprintf(w, "  warm pool create -> first result p50 %.0f ms (target <= 1000 ms)\n", c.CreatePool.P50)
	}
	if len(c.Languages) > 0 {
		fmt.Fprintln(w, "  per language: 1+1 on a warm context (p50, ratio to Python's), first run in a running VM, warm pool create -> first result (p50)")
		for _, l := range c.Languages {
			fmt.Fprintf(w, "    %-11s 1+1 %7.1f ms  %5.2fx   first run %8.0f ms   pool create %8.0f ms\n",
				l.Language, l.RoundTrip.P50, l.Ratio, l.FirstRun, l.PoolCreate.P50)
		}
	}
}
