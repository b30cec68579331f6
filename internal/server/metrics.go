package server

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// metrics holds operation latency histograms for the Prometheus endpoint.
type metrics struct {
	mu  sync.Mutex
	ops map[string]*histogram
}

var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

type histogram struct {
	counts []uint64 // per bucket, cumulative at export
	count  uint64
	sum    float64
}

func (m *metrics) observe(op string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ops == nil {
		m.ops = map[string]*histogram{}
	}
	h := m.ops[op]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(latencyBuckets))}
		m.ops[op] = h
	}
	sec := d.Seconds()
	for i, b := range latencyBuckets {
		if sec <= b {
			h.counts[i]++
		}
	}
	h.count++
	h.sum += sec
}

// serveMetrics writes the Prometheus text exposition (admin token; point
// Prometheus's bearer_token at it).
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	vms, err := s.svc.List(r.Context())
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	byState := map[store.State]int{}
	for _, st := range store.States {
		byState[st] = 0
	}
	var committed int64
	for _, v := range vms {
		byState[v.State]++
		if v.State == "running" || v.State == "paused" || v.State == "creating" {
			committed += v.MemoryMiB << 20
		}
	}
	fmt.Fprintln(bw, "# HELP agentvm_vms VMs by state.")
	fmt.Fprintln(bw, "# TYPE agentvm_vms gauge")
	states := make([]store.State, 0, len(byState))
	for st := range byState {
		states = append(states, st)
	}
	slices.Sort(states)
	for _, st := range states {
		fmt.Fprintf(bw, "agentvm_vms{state=%q} %d\n", st, byState[st])
	}
	fmt.Fprintln(bw, "# HELP agentvm_vm_state_bytes Disk space of a suspended VM's saved memory and device state (allocated bytes of its state and RAM files).")
	fmt.Fprintln(bw, "# TYPE agentvm_vm_state_bytes gauge")
	var stateTotal int64
	for _, v := range vms {
		if n := s.svc.StateBytes(v); n > 0 {
			stateTotal += n
			fmt.Fprintf(bw, "agentvm_vm_state_bytes{vm=%q,name=%q} %d\n", v.ID, v.Name, n)
		}
	}
	fmt.Fprintln(bw, "# HELP agentvm_suspended_state_bytes Disk space of all suspended VMs' saved states.")
	fmt.Fprintln(bw, "# TYPE agentvm_suspended_state_bytes gauge")
	fmt.Fprintf(bw, "agentvm_suspended_state_bytes %d\n", stateTotal)
	fmt.Fprintln(bw, "# HELP agentvm_host_memory_committed_bytes Memory of the VMs holding RAM (running, paused, creating).")
	fmt.Fprintln(bw, "# TYPE agentvm_host_memory_committed_bytes gauge")
	fmt.Fprintf(bw, "agentvm_host_memory_committed_bytes %d\n", committed)
	if total, avail, ok := meminfo(); ok {
		fmt.Fprintln(bw, "# HELP agentvm_host_memory_total_bytes Host memory.")
		fmt.Fprintln(bw, "# TYPE agentvm_host_memory_total_bytes gauge")
		fmt.Fprintf(bw, "agentvm_host_memory_total_bytes %d\n", total)
		fmt.Fprintln(bw, "# HELP agentvm_host_memory_available_bytes Host MemAvailable.")
		fmt.Fprintln(bw, "# TYPE agentvm_host_memory_available_bytes gauge")
		fmt.Fprintf(bw, "agentvm_host_memory_available_bytes %d\n", avail)
	}
	fmt.Fprintln(bw, "# HELP agentvm_admission_refusals_total Operations refused because the host was short of memory or disk (HTTP 507).")
	fmt.Fprintln(bw, "# TYPE agentvm_admission_refusals_total counter")
	mem, disk := s.svc.AdmissionRefusals()
	fmt.Fprintf(bw, "agentvm_admission_refusals_total{resource=\"memory\"} %d\n", mem)
	fmt.Fprintf(bw, "agentvm_admission_refusals_total{resource=\"disk\"} %d\n", disk)
	if s.cfg.KSM {
		if saved, ok := ksmSavedBytes(); ok {
			fmt.Fprintln(bw, "# HELP agentvm_ksm_saved_bytes Memory the host's page merging (serve --ksm) saves, host-wide.")
			fmt.Fprintln(bw, "# TYPE agentvm_ksm_saved_bytes gauge")
			fmt.Fprintf(bw, "agentvm_ksm_saved_bytes %d\n", saved)
		}
	}
	fmt.Fprintln(bw, "# HELP agentvm_warm_pool_ready Ready warm-pool VMs.")
	fmt.Fprintln(bw, "# TYPE agentvm_warm_pool_ready gauge")
	ready := 0
	for _, n := range s.svc.PoolReady() {
		ready += n
	}
	fmt.Fprintf(bw, "agentvm_warm_pool_ready %d\n", ready)

	fmt.Fprintln(bw, "# HELP agentvm_network_limit_refusals_total Guest TCP connections, UDP flows and DNS queries refused because the VM was at its cap.")
	fmt.Fprintln(bw, "# TYPE agentvm_network_limit_refusals_total counter")
	for _, kind := range network.LimitKinds {
		fmt.Fprintf(bw, "agentvm_network_limit_refusals_total{kind=%q} %d\n", kind, network.LimitRefusals(kind))
	}

	s.metrics.mu.Lock()
	ops := make([]string, 0, len(s.metrics.ops))
	for op := range s.metrics.ops {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	fmt.Fprintln(bw, "# HELP agentvm_operation_duration_seconds Duration of API operations (create, start, stop, pause, resume, suspend, snapshot, fork, resize, delete, exec).")
	fmt.Fprintln(bw, "# TYPE agentvm_operation_duration_seconds histogram")
	for _, op := range ops {
		h := s.metrics.ops[op]
		for i, b := range latencyBuckets {
			fmt.Fprintf(bw, "agentvm_operation_duration_seconds_bucket{op=%q,le=%q} %d\n", op, strconv.FormatFloat(b, 'g', -1, 64), h.counts[i])
		}
		fmt.Fprintf(bw, "agentvm_operation_duration_seconds_bucket{op=%q,le=\"+Inf\"} %d\n", op, h.count)
		fmt.Fprintf(bw, "agentvm_operation_duration_seconds_sum{op=%q} %g\n", op, h.sum)
		fmt.Fprintf(bw, "agentvm_operation_duration_seconds_count{op=%q} %d\n", op, h.count)
	}
	s.metrics.mu.Unlock()
}

func meminfo() (total, avail int64, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	return total, avail, total > 0
}
