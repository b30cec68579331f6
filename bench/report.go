package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Stats summarises durations in milliseconds (nearest-rank percentiles).
type Stats struct {
	N    int       `json:"n"`
	Min  float64   `json:"min_ms"`
	P50  float64   `json:"p50_ms"`
	P90  float64   `json:"p90_ms"`
	Max  float64   `json:"max_ms"`
	Mean float64   `json:"mean_ms"`
	Raw  []float64 `json:"samples_ms,omitempty"`
}

func summarize(d []float64) Stats {
	if len(d) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), d...)
	sort.Float64s(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{N: len(s), Min: s[0], P50: pct(0.5), P90: pct(0.9), Max: s[len(s)-1], Mean: sum / float64(len(s)), Raw: round1(d)}
}

func round1(d []float64) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = math.Round(v*10) / 10
	}
	return out
}

type Host struct {
	Accel          string `json:"accel"`
	QEMUVersion    string `json:"qemu_version"`
	NProc          int    `json:"nproc"`
	GoVersion      string `json:"go_version"`
	ServerVersion  string `json:"server_version"`
	LoadAvgAtStart string `json:"loadavg_at_start"`
}

type Config struct {
	Creates      int   `json:"creates"`
	Execs        int   `json:"execs"`
	CLIExecs     int   `json:"cli_execs"`
	SSHNew       int   `json:"ssh_new"`
	SSHCM        int   `json:"ssh_controlmaster"`
	KeepTemplate bool  `json:"keep_template"`
	MemoryMiB    int64 `json:"memory_mib"`
	DiskGiB      int64 `json:"disk_gib"`
}

type ColdBoot struct {
	Measured                 bool      `json:"measured"` // false with -keep-template
	TemplateKey              string    `json:"template_key"`
	TemplateJSON             string    `json:"template_json"`
	TemplateColdBootMs       int64     `json:"template_cold_boot_ms"`
	TemplateCreatedAt        time.Time `json:"template_created_at"`
	TemplateAccel            string    `json:"template_accel"`
	FirstCreateServerMs      int64     `json:"first_create_server_ms"`
	FirstCreateWallMs        int64     `json:"first_create_wall_ms"`
	FirstCreateToFirstExecMs int64     `json:"first_create_to_first_exec_ms"`
	FirstExecRetries         int       `json:"first_exec_retries"`
}

type ExecStats struct {
	SDKExec Stats `json:"sdk_exec"`
	SDKRun  Stats `json:"sdk_run"`
	CLI     Stats `json:"cli"`
	// Guest is the agent's own duration of `true` (ms resolution) over the SDK calls.
	Guest Stats `json:"guest_duration"`
}

type SSHStats struct {
	InstallSeconds   float64 `json:"install_seconds"`
	TunnelBanner     Stats   `json:"dialtcp_to_banner"`
	New              Stats   `json:"new_connection"`
	ControlMaster    Stats   `json:"controlmaster"`
	MasterOpenMs     float64 `json:"master_open_ms"`
	TunnelDialErrors int     `json:"tunnel_dial_errors"`
	Error            string  `json:"error,omitempty"`
}

type Ratios struct {
	TemplateColdBootOverCreateToExecP50 float64 `json:"template_cold_boot_over_create_to_first_exec_p50,omitempty"`
	FirstCreateWallOverCreateToExecP50  float64 `json:"first_create_wall_over_create_to_first_exec_p50,omitempty"`
	SDKExecOverSSHNew                   float64 `json:"sdk_exec_p50_over_ssh_new_p50,omitempty"`
	SDKExecOverSSHCM                    float64 `json:"sdk_exec_p50_over_ssh_controlmaster_p50,omitempty"`
	SDKRunOverSSHNew                    float64 `json:"sdk_run_p50_over_ssh_new_p50,omitempty"`
	SDKRunOverSSHCM                     float64 `json:"sdk_run_p50_over_ssh_controlmaster_p50,omitempty"`
	CLIOverSSHNew                       float64 `json:"cli_p50_over_ssh_new_p50,omitempty"`
	CLIOverSSHCM                        float64 `json:"cli_p50_over_ssh_controlmaster_p50,omitempty"`
}

type Report struct {
	StartedAt         time.Time `json:"started_at"`
	FinishedAt        time.Time `json:"finished_at"`
	Host              Host      `json:"host"`
	Config            Config    `json:"config"`
	ColdBoot          ColdBoot  `json:"cold_boot"`
	CreateToFirstExec Stats     `json:"create_to_first_exec"`
	CreateOnly        Stats     `json:"create_only"`
	CreateServer      Stats     `json:"create_server_ms"`
	// Creates served by the warm pool (a second server with --warm-pool 1, each
	// create made once the pool is refilled).
	PoolCreateToFirstExec Stats     `json:"pool_create_to_first_exec"`
	PoolCreateServer      Stats     `json:"pool_create_server_ms"`
	CreateRetries         int       `json:"create_first_exec_retries"`
	Exec                  ExecStats `json:"exec_true"`
	SSH                   SSHStats  `json:"ssh"`
	Ratios                Ratios    `json:"ratios"`
	// Lifecycle is set only by -lifecycle (then the other results are empty).
	Lifecycle *LifecycleReport `json:"lifecycle,omitempty"`
	E2B       *E2BReport       `json:"e2b,omitempty"`
	TSSDK     *TSSDKReport     `json:"tssdk,omitempty"`
	PySDK     *PySDKReport     `json:"pysdk,omitempty"`
	Code      *CodeReport      `json:"code,omitempty"`
	Browser   *BrowserReport   `json:"browser,omitempty"`
	MemGrow   *MemGrowReport   `json:"memgrow,omitempty"`
	Templates *TemplatesReport `json:"templates,omitempty"`
	Git       *GitReport       `json:"git,omitempty"`
	Record    *RecordReport    `json:"record,omitempty"`
	Diff      *DiffReport      `json:"diff,omitempty"`
	Memory    *MemoryReport    `json:"memory,omitempty"`
	CrashLoop *CrashLoopReport `json:"crashloop,omitempty"`
	Stress    *StressReport    `json:"stress,omitempty"`
	Cluster   *ClusterReport   `json:"cluster,omitempty"`
	Compare   *CompareReport   `json:"compare,omitempty"`
	Access    *AccessReport    `json:"access,omitempty"`
	Net       *NetReport       `json:"net,omitempty"`
	Notes     []string         `json:"notes"`
	Errors    []string         `json:"errors,omitempty"`
}

func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return math.Round(a/b*1000) / 1000
}

func (r *Report) computeRatios() {
	c2e := r.CreateToFirstExec.P50
	r.Ratios = Ratios{
		TemplateColdBootOverCreateToExecP50: ratio(float64(r.ColdBoot.TemplateColdBootMs), c2e),
		FirstCreateWallOverCreateToExecP50:  ratio(float64(r.ColdBoot.FirstCreateWallMs), c2e),
		SDKExecOverSSHNew:                   ratio(r.Exec.SDKExec.P50, r.SSH.New.P50),
		SDKExecOverSSHCM:                    ratio(r.Exec.SDKExec.P50, r.SSH.ControlMaster.P50),
		SDKRunOverSSHNew:                    ratio(r.Exec.SDKRun.P50, r.SSH.New.P50),
		SDKRunOverSSHCM:                     ratio(r.Exec.SDKRun.P50, r.SSH.ControlMaster.P50),
		CLIOverSSHNew:                       ratio(r.Exec.CLI.P50, r.SSH.New.P50),
		CLIOverSSHCM:                        ratio(r.Exec.CLI.P50, r.SSH.ControlMaster.P50),
	}
	r.Notes = append([]string{
		"Both paths go through the agentvm daemon: exec travels HTTP -> daemon -> virtio-serial -> guest agent; " +
			"ssh travels a local forwarder -> HTTP Upgrade agentvm-tcp (client.DialTCP) -> daemon -> the VM's virtual network -> sshd.",
		"exec/ssh ratios below 1 mean the agentvm path is faster than that ssh variant.",
		"create-to-first-exec is timed from sending POST /v1/vms to the completion of the first exec of `true`; VM deletion is not timed.",
		"The guest image build is not measured (it is ensured before the server starts).",
	}, r.Notes...)
	if !r.ColdBoot.Measured {
		r.Notes = append(r.Notes, "-keep-template: the template was already cached, so its cold_boot_ms is from when it was built ("+
			r.ColdBoot.TemplateCreatedAt.Format(time.RFC3339)+"), not from this run.")
	}
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

func statsLine(w io.Writer, name string, s Stats) {
	if s.N == 0 {
		fmt.Fprintf(w, "  %-34s (not measured)\n", name)
		return
	}
	fmt.Fprintf(w, "  %-34s n=%-3d p50 %8s  p90 %8s  min %8s  max %8s ms\n", name, s.N, f1(s.P50), f1(s.P90), f1(s.Min), f1(s.Max))
}

func ratioLine(w io.Writer, name string, v float64) {
	if v == 0 {
		fmt.Fprintf(w, "  %-52s n/a\n", name)
		return
	}
	fmt.Fprintf(w, "  %-52s %7.3f  (%.1fx %s)\n", name, v, math.Max(v, 1/v), map[bool]string{true: "slower", false: "faster"}[v > 1])
}

// Print writes the human-readable report.
func (r *Report) Print(w io.Writer) {
	line := strings.Repeat("=", 78)
	fmt.Fprintln(w, line)
	fmt.Fprintln(w, "agentvm benchmark  ", r.StartedAt.Format(time.RFC3339), " took", r.FinishedAt.Sub(r.StartedAt).Round(time.Second))
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "Host: accel=%s  qemu=%q  nproc=%d  loadavg at start=%s  server=%s\n",
		r.Host.Accel, r.Host.QEMUVersion, r.Host.NProc, r.Host.LoadAvgAtStart, r.Host.ServerVersion)
	fmt.Fprintf(w, "VM shape: %d MiB, %d GiB disk, 1 vCPU\n\n", r.Config.MemoryMiB, r.Config.DiskGiB)

	cb := r.ColdBoot
	fmt.Fprintln(w, "1. Template cold boot", map[bool]string{true: "(fresh template dir: measured in this run)",
		false: "(-keep-template: cached template, NOT measured in this run)"}[cb.Measured])
	fmt.Fprintf(w, "  template cold_boot_ms (template.json)  %8d ms   key %s\n", cb.TemplateColdBootMs, cb.TemplateKey)
	fmt.Fprintf(w, "  first create, server create_ms         %8d ms\n", cb.FirstCreateServerMs)
	fmt.Fprintf(w, "  first create, wall time                %8d ms\n", cb.FirstCreateWallMs)
	fmt.Fprintf(w, "  first create -> first exec done        %8d ms   (exec retries %d)\n\n", cb.FirstCreateToFirstExecMs, cb.FirstExecRetries)

	fmt.Fprintf(w, "2. Create from the warm template, %d sequential (each deleted after, untimed)\n", r.CreateToFirstExec.N)
	statsLine(w, "create -> first exec `true`", r.CreateToFirstExec)
	statsLine(w, "create only (wall)", r.CreateOnly)
	statsLine(w, "create only (server create_ms)", r.CreateServer)
	ratioLine(w, "template cold boot / create-to-first-exec p50", r.Ratios.TemplateColdBootOverCreateToExecP50)
	ratioLine(w, "first create wall / create-to-first-exec p50", r.Ratios.FirstCreateWallOverCreateToExecP50)
	statsLine(w, "warm pool: create -> first exec", r.PoolCreateToFirstExec)
	statsLine(w, "warm pool: create (server create_ms)", r.PoolCreateServer)
	if r.PoolCreateToFirstExec.P50 > 0 {
		ratioLine(w, "template cold boot / warm-pool create-to-first-exec p50", ratio(float64(r.ColdBoot.TemplateColdBootMs), r.PoolCreateToFirstExec.P50))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "3. Exec round trip of `true` on one VM (after warm-up; Exec and Run interleaved)")
	statsLine(w, "SDK client.Exec (buffered JSON)", r.Exec.SDKExec)
	statsLine(w, "SDK client.Run (upgraded stream)", r.Exec.SDKRun)
	statsLine(w, "CLI `agentvm exec VM -- true`", r.Exec.CLI)
	statsLine(w, "guest-side duration (agent, SDK)", r.Exec.Guest)
	fmt.Fprintln(w)

	fmt.Fprintln(w, "4. OpenSSH baseline into the same VM (through DialTCP + local forwarder)")
	if r.SSH.Error != "" {
		fmt.Fprintf(w, "  ssh baseline unavailable: %s\n", r.SSH.Error)
	}
	if r.SSH.InstallSeconds > 0 {
		fmt.Fprintf(w, "  apt-get install openssh-server took %.0f s (not part of any ratio)\n", r.SSH.InstallSeconds)
	}
	statsLine(w, "DialTCP :22 until sshd banner", r.SSH.TunnelBanner)
	statsLine(w, "ssh true (new connection each)", r.SSH.New)
	statsLine(w, "ssh true (ControlMaster reuse)", r.SSH.ControlMaster)
	if r.SSH.MasterOpenMs > 0 {
		fmt.Fprintf(w, "  (opening the ControlMaster: %.1f ms; tunnel dial errors: %d)\n", r.SSH.MasterOpenMs, r.SSH.TunnelDialErrors)
	}
	ratioLine(w, "SDK Exec p50 / ssh new-connection p50", r.Ratios.SDKExecOverSSHNew)
	ratioLine(w, "SDK Exec p50 / ssh ControlMaster p50", r.Ratios.SDKExecOverSSHCM)
	ratioLine(w, "SDK Run p50 / ssh new-connection p50", r.Ratios.SDKRunOverSSHNew)
	ratioLine(w, "SDK Run p50 / ssh ControlMaster p50", r.Ratios.SDKRunOverSSHCM)
	ratioLine(w, "CLI exec p50 / ssh new-connection p50", r.Ratios.CLIOverSSHNew)
	ratioLine(w, "CLI exec p50 / ssh ControlMaster p50", r.Ratios.CLIOverSSHCM)
	fmt.Fprintln(w)
	r.printTail(w, line)
}
