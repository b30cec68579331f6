package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// The template benchmark (issue 31's measure): a full build of a
// Dockerfile against a rebuild whose last step changed and a rebuild with
// every step cached; a create from the built template until its service
// answers HTTP against a boot of the same machine from its disk until the
// service (started by systemd at boot) answers.

// TemplatesReport is the result of -templates.
type TemplatesReport struct {
	Dockerfile   string  `json:"dockerfile"`
	FullBuild    Stats   `json:"full_build"`        // --no-cache
	RebuildLast  Stats   `json:"rebuild_last_step"` // the last RUN changed
	RebuildNoop  Stats   `json:"rebuild_every_step_cached"`
	CreateToHTTP Stats   `json:"create_to_http"`    // create --template until curl answers in the VM
	BootToHTTP   Stats   `json:"cold_boot_to_http"` // start of the stopped VM until curl answers
	RebuildRatio float64 `json:"rebuild_last_over_full_p50"`
	CreateRatio  float64 `json:"create_over_cold_boot_p50"`
	FirstTryHTTP int     `json:"creates_answering_at_first_try"`
	StateMiB     int64   `json:"template_state_mib"`
}

var (
	templateBuilds    = 2 // full builds (the first one also warms the image's template)
	templateRebuilds  = 3
	templateCreations = 5
	templateColdBoots = 2
)

// benchDockerfile installs a Debian package (the usual first step), copies
// an app and ends with a step the rebuild changes.
const benchDockerfile = `FROM default
RUN apt-get update && apt-get install -y --no-install-recommends ripgrep && rm -rf /var/lib/apt/lists/*
COPY app/ /srv/app/
RUN python3 -m compileall -q /srv/app
RUN echo %s > /srv/app/version.txt
EXPOSE 8000
CMD ["python3", "-m", "http.server", "8000", "--directory", "/srv/app"]
`

func tarOfFiles(files map[string]string) *bytes.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg, ModTime: time.Now()})
		io.WriteString(tw, files[n])
	}
	tw.Close()
	return bytes.NewReader(buf.Bytes())
}

func (b *bench) buildTemplate(ctx context.Context, version string, noCache bool) (*api.BuiltTemplate, time.Duration, error) {
	files := map[string]string{
		"Dockerfile":        fmt.Sprintf(benchDockerfile, version),
		"app/index.html":    "<h1>bench</h1>\n",
		"app/handlers.py":   strings.Repeat("def f(x):\n    return x * 2\n\n", 200),
		"app/lib/models.py": strings.Repeat("class M:\n    pass\n\n", 200),
	}
	t0 := time.Now()
	t, err := b.c.BuildTemplate(ctx, "bench-app", tarOfFiles(files), client.BuildOptions{NoCache: noCache, Memory: fmt.Sprint(vmMemory >> 20)}, nil)
	return t, time.Since(t0), err
}

// httpAnswers runs curl in the VM once; ok when the service answered.
func (b *bench) httpAnswers(ctx context.Context, id string) bool {
	ex, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"curl", "-sf", "--max-time", "5", "-o", "/dev/null", "http://127.0.0.1:8000/index.html"}})
	return err == nil && ex.ExitCode == 0
}

func (b *bench) untilHTTP(ctx context.Context, id string) (tries int, err error) {
	deadline := time.Now().Add(5 * time.Minute)
	for tries = 1; ; tries++ {
		if b.httpAnswers(ctx, id) {
			return tries, nil
		}
		if time.Now().After(deadline) {
			return tries, fmt.Errorf("the service of %s never answered", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *bench) runTemplates(ctx context.Context) error {
	r := &TemplatesReport{Dockerfile: fmt.Sprintf(benchDockerfile, "v1")}
	b.r.Templates = r
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b.c.DeleteTemplate(c, "bench-app")
	}()
	var full, last, noop []float64
	for i := 0; i < templateBuilds; i++ {
		logf("templates: full build %d/%d (--no-cache)", i+1, templateBuilds)
		_, d, err := b.buildTemplate(ctx, "v0", true)
		if err != nil {
			return fmt.Errorf("full build: %w", err)
		}
		full = append(full, millis(d))
	}
	for i := 0; i < templateRebuilds; i++ {
		logf("templates: rebuild %d/%d with the last step changed", i+1, templateRebuilds)
		_, d, err := b.buildTemplate(ctx, fmt.Sprintf("v%d", i+1), false)
		if err != nil {
			return fmt.Errorf("rebuild: %w", err)
		}
		last = append(last, millis(d))
		t, d, err := b.buildTemplate(ctx, fmt.Sprintf("v%d", i+1), false)
		if err != nil {
			return fmt.Errorf("no-op rebuild: %w", err)
		}
		noop = append(noop, millis(d))
		r.StateMiB = t.StateBytes >> 20
	}
	var creates, boots []float64
	for i := 0; i < templateCreations; i++ {
		t0 := time.Now()
		v, err := b.c.CreateVM(ctx, api.CreateVMRequest{Template: "bench-app"})
		if err != nil {
			return err
		}
		b.track(v.ID, v.PID)
		tries, err := b.untilHTTP(ctx, v.ID)
		if err != nil {
			return err
		}
		creates = append(creates, millis(time.Since(t0)))
		if tries == 1 {
			r.FirstTryHTTP++
		}
		if i < templateColdBoots { // the baseline: the same machine booted from its disk
			if _, err := b.c.StopVM(ctx, v.ID); err != nil {
				return err
			}
			t0 := time.Now()
			if _, err := b.c.StartVM(ctx, v.ID); err != nil {
				return err
			}
			if _, err := b.untilHTTP(ctx, v.ID); err != nil {
				return err
			}
			boots = append(boots, millis(time.Since(t0)))
		}
		if err := b.remove(v.ID); err != nil {
			return err
		}
	}
	r.FullBuild, r.RebuildLast, r.RebuildNoop = summarize(full), summarize(last), summarize(noop)
	r.CreateToHTTP, r.BootToHTTP = summarize(creates), summarize(boots)
	r.RebuildRatio = ratio(r.RebuildLast.P50, r.FullBuild.P50)
	r.CreateRatio = ratio(r.CreateToHTTP.P50, r.BootToHTTP.P50)
	return nil
}

// PrintTemplates prints the -templates results.
func (r *Report) PrintTemplates(w io.Writer) {
	m := r.Templates
	if m == nil {
		return
	}
	fmt.Fprintln(w, "templates (a Dockerfile: apt-get install, COPY, compileall, a last RUN; CMD an HTTP server)")
	statsLine(w, "full build (--no-cache)", m.FullBuild)
	statsLine(w, "rebuild, last step changed", m.RebuildLast)
	statsLine(w, "rebuild, every step cached", m.RebuildNoop)
	statsLine(w, "create --template to HTTP answer", m.CreateToHTTP)
	statsLine(w, "cold boot to HTTP answer", m.BootToHTTP)
	ratioLine(w, "rebuild (last step changed) / full build, p50", m.RebuildRatio)
	ratioLine(w, "create from template / cold boot, to HTTP, p50", m.CreateRatio)
	fmt.Fprintf(w, "  creates whose service answered the first curl: %d of %d; template state %d MiB\n", m.FirstTryHTTP, m.CreateToHTTP.N, m.StateMiB)
}
