package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/pkg/client"
)

// The memory benchmark (issue 28, item 6): the daemon's resident memory
// while scoped requests make it hold what a guest sends, on a server with
// the default memory budget against one with the budget off, in the same
// run: 8 parallel buffered execs of 16 MiB of NUL bytes (JSON escapes each
// byte to six), and 8 parallel screenshots of a 4096x4096 framebuffer of
// noise (decoded to RGBA, encoded as a PNG the size of the screen).

// MemoryReport is the result of -memory.
type MemoryReport struct {
	Parallel  int       `json:"parallel"`
	ExecMiB   int       `json:"exec_stdout_mib"`
	Side      int       `json:"framebuffer_side"`
	Budget    memoryRun `json:"budget_default"`
	Unbounded memoryRun `json:"budget_off"`
}

type memoryRun struct {
	Server        string  `json:"server"`
	IdleRSSMiB    float64 `json:"idle_rss_mib"`
	ExecPeakMiB   float64 `json:"exec_peak_above_idle_mib"`
	ExecOK        int     `json:"execs_complete"`
	ExecTruncated int     `json:"execs_truncated_by_budget"`
	ExecRefused   int     `json:"execs_refused_503"`
	ShotPeakMiB   float64 `json:"screenshot_peak_above_idle_mib"`
	ShotOK        int     `json:"screenshots_ok"`
	ShotRefused   int     `json:"screenshots_refused_503"`
}

var memoryParallel = 8

// rssMiB is a process's resident set size.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// peakRSS samples pid's RSS every 10 ms while fn runs and returns the peak.
func peakRSS(pid int, fn func()) float64 {
	stop := make(chan struct{})
	peak := make(chan float64)
	go func() {
		p := 0.0
		for {
			p = max(p, rssMiB(pid))
			select {
			case <-stop:
				peak <- p
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	fn()
	close(stop)
	return <-peak
}

// noiseXWD is an XWD file (Xvfb's layout: 32-bit pixels, LSB first) of a
// side x side screen of noise.
func noiseXWD(side int) []byte {
	var b bytes.Buffer
	name := []byte("bench\x00")
	h := []uint32{uint32(100 + len(name)), 7, 2, 24, uint32(side), uint32(side), 0, 0, 32, 0, 32, 32, uint32(side * 4), 4,
		0xff0000, 0xff00, 0xff, 8, 0, 0, uint32(side), uint32(side), 0, 0, 0}
	binary.Write(&b, binary.BigEndian, h)
	b.Write(name)
	px := make([]byte, side*side*4)
	rand.New(rand.NewSource(1)).Read(px)
	b.Write(px)
	return b.Bytes()
}

func (b *bench) runMemory(ctx context.Context) error {
	r := &MemoryReport{Parallel: memoryParallel, ExecMiB: 16, Side: 4096}
	b.r.Memory = r
	off, err := startServer(ctx, b.srv.bin, filepath.Join(b.tmp, "off"), true, 0, "--memory-budget", "off")
	if err != nil {
		return err
	}
	defer off.stop()
	fb := noiseXWD(r.Side)
	for _, c := range []struct {
		s   *server
		run *memoryRun
		tag string
	}{{b.srv, &r.Budget, "serve (default --memory-budget 1G)"}, {off, &r.Unbounded, "serve --memory-budget off"}} {
		c.run.Server = c.tag
		if err := memoryOn(ctx, c.s, fb, r, c.run); err != nil {
			return fmt.Errorf("%s: %w", c.tag, err)
		}
	}
	return nil
}

func memoryOn(ctx context.Context, s *server, fb []byte, r *MemoryReport, run *memoryRun) error {
	v, err := s.client.CreateVM(ctx, api.CreateVMRequest{})
	if err != nil {
		return err
	}
	defer s.client.DeleteVM(context.Background(), v.ID)
	tok, err := s.client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermExec, api.PermDisplay}})
	if err != nil {
		return err
	}
	// One token per request: the per-token limit is not what is measured.
	scoped := func() *client.Client { return client.New(s.url, tok.Secret) }
	if _, err := s.client.WriteFile(ctx, v.ID, image.BrowserFramebuffer, bytes.NewReader(fb), int64(len(fb)), client.WriteOptions{MkDirs: true}); err != nil {
		return fmt.Errorf("write the framebuffer: %w", err)
	}
	pid := s.cmd.Process.Pid
	time.Sleep(2 * time.Second) // let the upload's buffers go
	run.IdleRSSMiB = rssMiB(pid)
	logf("memory: %s: idle RSS %.0f MiB", run.Server, run.IdleRSSMiB)
	var mu sync.Mutex
	peak := peakRSS(pid, func() {
		var wg sync.WaitGroup
		for range r.Parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ex, err := scoped().Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"head", "-c", strconv.Itoa(r.ExecMiB << 20), "/dev/zero"}})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil && strings.Contains(err.Error(), "memory budget"):
					run.ExecRefused++
				case err != nil:
					logf("memory: exec: %v", err)
				case ex.TruncatedBy == "memory_budget":
					run.ExecTruncated++
				default:
					run.ExecOK++
				}
			}()
		}
		wg.Wait()
	})
	run.ExecPeakMiB = peak - run.IdleRSSMiB
	time.Sleep(2 * time.Second)
	idle := rssMiB(pid)
	peak = peakRSS(pid, func() {
		var wg sync.WaitGroup
		for range r.Parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				png, err := scoped().Screenshot(ctx, v.ID, 1)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil && strings.Contains(err.Error(), "memory budget"):
					run.ShotRefused++
				case err != nil:
					logf("memory: screenshot: %v", err)
				case len(png) > 0:
					run.ShotOK++
				}
			}()
		}
		wg.Wait()
	})
	run.ShotPeakMiB = peak - idle
	logf("memory: %s: execs peak +%.0f MiB (%d complete, %d truncated, %d refused), screenshots peak +%.0f MiB (%d ok, %d refused)",
		run.Server, run.ExecPeakMiB, run.ExecOK, run.ExecTruncated, run.ExecRefused, run.ShotPeakMiB, run.ShotOK, run.ShotRefused)
	return nil
}

// PrintMemory prints the -memory results.
func (r *Report) PrintMemory(w io.Writer) {
	m := r.Memory
	if m == nil {
		return
	}
	fmt.Fprintf(w, "Daemon RSS above idle: %d parallel buffered execs of %d MiB of NULs, %d parallel screenshots of a %dx%d framebuffer\n",
		m.Parallel, m.ExecMiB, m.Parallel, m.Side, m.Side)
	for _, run := range []memoryRun{m.Budget, m.Unbounded} {
		fmt.Fprintf(w, "  %-36s idle %5.0f MiB | execs +%5.0f MiB (%d complete, %d truncated, %d refused) | screenshots +%5.0f MiB (%d ok, %d refused)\n",
			run.Server, run.IdleRSSMiB, run.ExecPeakMiB, run.ExecOK, run.ExecTruncated, run.ExecRefused, run.ShotPeakMiB, run.ShotOK, run.ShotRefused)
	}
	fmt.Fprintf(w, "  budget off / default, peak above idle: execs %.2fx, screenshots %.2fx (target: default under 1024 MiB)\n",
		ratio(m.Unbounded.ExecPeakMiB, m.Budget.ExecPeakMiB), ratio(m.Unbounded.ShotPeakMiB, m.Budget.ShotPeakMiB))
}
