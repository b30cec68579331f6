package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
)

// sandboxMetric is one sample of GET /sandboxes/{id}/metrics.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metricsScript prints /proc/stat's cpu line twice 200 ms apart, the
// memory counters and the root file system's usage.
const metricsScript = `head -n1 /proc/stat; sleep 0.2; head -n1 /proc/stat; grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; df -B1 --output=used,size / | tail -n1`

// metrics answers one sample taken now (a paused sandbox has none).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, _, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	// One sample, taken now: a range that does not hold now has none.
	now := time.Now()
	for _, b := range []struct {
		name   string
		before bool
	}{{"start", false}, {"end", true}} {
		v := r.URL.Query().Get(b.name)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			apiError(w, http.StatusBadRequest, "%s must be unix seconds", b.name)
			return
		}
		if t := time.Unix(sec, 0); (b.before && now.After(t.Add(time.Second))) || (!b.before && now.Before(t)) {
			writeJSON(w, http.StatusOK, []sandboxMetric{})
			return
		}
	}
	if paused(v) {
		writeJSON(w, http.StatusOK, []sandboxMetric{})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	_, g, err := s.cfg.VMs.Guest(ctx, v.ID)
	if err != nil {
		vmError(w, err)
		return
	}
	var out bytes.Buffer
	if _, err := g.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", metricsScript}}, nil, &limitWriter{w: &out, n: 64 << 10}, io.Discard); err != nil {
		apiError(w, http.StatusServiceUnavailable, "read the sandbox's counters: %v", err)
		return
	}
	m := parseMetrics(out.String())
	m.CPUCount = v.CPUs
	m.Timestamp, m.TimestampUnix = now.UTC(), now.Unix()
	writeJSON(w, http.StatusOK, []sandboxMetric{m})
}

// parseMetrics reads metricsScript's output (the guest's words: anything
// unexpected is left at zero).
func parseMetrics(s string) sandboxMetric {
	var m sandboxMetric
	var cpu [][]int64
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 5 && f[0] == "cpu":
			var vals []int64
			for _, x := range f[1:] {
				n, _ := strconv.ParseInt(x, 10, 64)
				vals = append(vals, n)
			}
			cpu = append(cpu, vals)
		case len(f) >= 2 && strings.HasSuffix(f[0], ":"):
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "MemTotal:":
				m.MemTotal = n << 10
			case "MemAvailable:":
				m.MemUsed = -(n << 10)
			case "Cached:":
				m.MemCache = n << 10
			}
		case len(f) == 2:
			m.DiskUsed, _ = strconv.ParseInt(f[0], 10, 64)
			m.DiskTotal, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if m.MemUsed < 0 {
		m.MemUsed += m.MemTotal
	}
	m.MemUsed = max(m.MemUsed, 0)
	if len(cpu) == 2 {
		var total, idle int64
		for i := range min(len(cpu[0]), len(cpu[1])) {
			d := cpu[1][i] - cpu[0][i]
			total += d
			if i == 3 || i == 4 { // idle, iowait
				idle += d
			}
		}
		if total > 0 {
			m.CPUUsedPct = float64(total-idle) * 100 / float64(total)
		}
	}
	return m
}

// limitWriter keeps the first n bytes and drops the rest.
type limitWriter struct {
	w io.Writer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

func jsonEncode(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
