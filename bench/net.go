package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// NetReport holds the -net results.
type NetReport struct {
	Concurrency      int     `json:"concurrency"`
	Seconds          float64 `json:"seconds_per_run"`
	TCPReqPerSec     float64 `json:"tcp_exposure_req_per_s"`
	ProxyReqPerSec   float64 `json:"preview_proxy_req_per_s"`
	ProxyVsTCP       float64 `json:"proxy_vs_tcp"`
	TCPP50Ms         float64 `json:"tcp_exposure_p50_ms_c1"`
	ProxyP50Ms       float64 `json:"preview_proxy_p50_ms_c1"`
	AddedP50Ms       float64 `json:"added_p50_ms"`
	TCPErrors        int64   `json:"tcp_errors"`
	ProxyErrors      int64   `json:"proxy_errors"`
	VMToHostMiBs     float64 `json:"vm_to_host_loopback_mib_s"`
	VMToHostMiB      int     `json:"vm_to_host_mib"`
	HostToVMFilesMiB float64 `json:"-"`
}

// load runs c keep-alive clients for d against url (with Host header host)
// and returns requests/s, the latencies and the error count.
func load(ctx context.Context, url, host string, c int, d time.Duration) (float64, []float64, int64) {
	tr := &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var n, errs atomic.Int64
	var mu sync.Mutex
	var lat []float64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []float64
			for time.Now().Before(end) && ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				if host != "" {
					req.Host = host
				}
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs.Add(1)
					continue
				}
				mine = append(mine, msf(time.Since(t0)))
				n.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	start := time.Now()
	wg.Wait()
	sort.Float64s(lat)
	return float64(n.Load()) / time.Since(start).Seconds(), lat, errs.Load()
}

func p50(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// runNet is `go run ./bench -net`.
func (b *bench) runNet(ctx context.Context) error {
	nr := &NetReport{Concurrency: 16, Seconds: 10}
	b.r.Net = nr
	h, err := b.c.Health(ctx)
	if err != nil {
		return err
	}
	b.r.Host.Accel, b.r.Host.ServerVersion = h.Accel, h.Version
	vm, err := b.create(ctx)
	if err != nil {
		return err
	}
	bin, err := b.buildWebsrv(ctx)
	if err != nil {
		return err
	}
	f, err := os.Open(bin)
	if err != nil {
		return err
	}
	fi, _ := f.Stat()
	_, err = b.c.WriteFile(ctx, vm, "/usr/local/bin/websrv", f, fi.Size(), client.WriteOptions{Mode: 0o755})
	f.Close()
	if err != nil {
		return err
	}
	r, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: "nohup /usr/local/bin/websrv :8000 >/tmp/websrv.log 2>&1 & for i in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"})
	if err != nil || r.ExitCode != 0 {
		return fmt.Errorf("start websrv: %v %+v", err, r)
	}
	if _, err := b.c.Expose(ctx, vm, api.ExposeRequest{Port: 8000, Public: true}); err != nil {
		return err
	}
	tcp, err := b.c.Expose(ctx, vm, api.ExposeRequest{Port: 8000, TCP: true})
	if err != nil {
		return err
	}
	v, _ := b.c.GetVM(ctx, vm)
	host := fmt.Sprintf("8000-%s.%s", v.Name, h.Domain)
	tcpURL, proxyURL := "http://"+tcp.Host+"/", "http://"+h.Proxy+"/"
	d := time.Duration(nr.Seconds * float64(time.Second))

	logf("warming both paths")
	load(ctx, tcpURL, "", 4, 2*time.Second)
	load(ctx, proxyURL, host, 4, 2*time.Second)
	logf("c=1 latency, 5 s each")
	_, lt, _ := load(ctx, tcpURL, "", 1, 5*time.Second)
	_, lp, _ := load(ctx, proxyURL, host, 1, 5*time.Second)
	nr.TCPP50Ms, nr.ProxyP50Ms = p50(lt), p50(lp)
	nr.AddedP50Ms = nr.ProxyP50Ms - nr.TCPP50Ms
	logf("c=%d throughput, %.0f s each", nr.Concurrency, nr.Seconds)
	nr.TCPReqPerSec, _, nr.TCPErrors = load(ctx, tcpURL, "", nr.Concurrency, d)
	nr.ProxyReqPerSec, _, nr.ProxyErrors = load(ctx, proxyURL, host, nr.Concurrency, d)
	nr.ProxyVsTCP = ratio(nr.ProxyReqPerSec, nr.TCPReqPerSec)
	logf("tcp exposure %.0f req/s, preview proxy %.0f req/s", nr.TCPReqPerSec, nr.ProxyReqPerSec)

	// VM -> host loopback through --allow-host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	var got atomic.Int64
	var first, last atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 256<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				last.Store(now)
				got.Add(int64(n))
			}
			if err != nil {
				break
			}
		}
		fmt.Fprint(w, "ok")
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if _, err := b.c.SetEgress(ctx, vm, &api.Egress{AllowHost: []int{port}}); err != nil {
		return err
	}
	nr.VMToHostMiB = 200
	r, err = b.c.Exec(ctx, vm, api.ExecRequest{Shell: "head -c " + strconv.Itoa(nr.VMToHostMiB) + "M /dev/zero | curl -s -T - http://host.agentvm.internal:" + strconv.Itoa(port) + "/"})
	if err != nil || r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "ok" {
		return fmt.Errorf("vm -> host upload: %v %+v", err, r)
	}
	if got.Load() != int64(nr.VMToHostMiB)<<20 {
		return fmt.Errorf("vm -> host: received %d bytes", got.Load())
	}
	nr.VMToHostMiBs = float64(got.Load()) / (1 << 20) / (float64(last.Load()-first.Load()) / 1e9)
	return nil
}

// PrintNet prints the -net report.
func (r *Report) PrintNet(w io.Writer) {
	fmt.Fprintf(w, "\nagentvm networking benchmark (%s, %d cores)\n\n", r.Host.Accel, r.Host.NProc)
	if n := r.Net; n != nil {
		fmt.Fprintf(w, "GET / (small page) from the VM's web server, keep-alive\n")
		fmt.Fprintf(w, "  c=%d, %.0f s: plain TCP exposure %.0f req/s, preview proxy %.0f req/s -> %.2fx (target >= 0.8x); errors %d / %d\n",
			n.Concurrency, n.Seconds, n.TCPReqPerSec, n.ProxyReqPerSec, n.ProxyVsTCP, n.TCPErrors, n.ProxyErrors)
		fmt.Fprintf(w, "  c=1 p50: plain TCP exposure %.2f ms, preview proxy %.2f ms -> added %.2f ms (target <= 1 ms)\n",
			n.TCPP50Ms, n.ProxyP50Ms, n.AddedP50Ms)
		fmt.Fprintf(w, "VM -> host loopback (curl -T of %d MiB to host.agentvm.internal, --allow-host): %.1f MiB/s\n", n.VMToHostMiB, n.VMToHostMiBs)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "ERROR: %s\n", e)
	}
}
