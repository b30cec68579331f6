package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"golang.org/x/crypto/ssh"
)

// AccessReport holds the -access results: 100 MiB transfers through the
// files API and through scp via the gateway, against scp to an OpenSSH sshd
// inside the same VM, and the terminal keystroke echo round trip.
type AccessReport struct {
	FileMiB            int     `json:"file_mib"`
	FilesUpMiBs        float64 `json:"files_api_upload_mib_s"`
	FilesDownMiBs      float64 `json:"files_api_download_mib_s"`
	GatewaySCPUpMiBs   float64 `json:"gateway_scp_upload_mib_s"`
	GatewaySCPDownMiBs float64 `json:"gateway_scp_download_mib_s"`
	// As the agent user, SFTP runs in a helper process in the guest.
	AgentSCPUpMiBs     float64 `json:"gateway_scp_agent_upload_mib_s"`
	AgentSCPDownMiBs   float64 `json:"gateway_scp_agent_download_mib_s"`
	SSHDSCPUpMiBs      float64 `json:"sshd_scp_upload_mib_s"`
	SSHDSCPDownMiBs    float64 `json:"sshd_scp_download_mib_s"`
	FilesVsSSHDUp      float64 `json:"files_vs_sshd_upload"`
	FilesVsSSHDDown    float64 `json:"files_vs_sshd_download"`
	GatewayVsSSHDUp    float64 `json:"gateway_vs_sshd_upload"`
	GatewayVsSSHDDown  float64 `json:"gateway_vs_sshd_download"`
	EchoTerminal       Stats   `json:"echo_terminal_ws"`
	EchoGatewaySSH     Stats   `json:"echo_gateway_ssh_pty"`
	EchoSSHD           Stats   `json:"echo_sshd_pty"`
	InstallSSHDSeconds float64 `json:"install_sshd_s"`
}

func mibs(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func fileSHA(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	io.CopyBuffer(h, f, make([]byte, 1<<20))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runAccess is `go run ./bench -access`.
func (b *bench) runAccess(ctx context.Context) error {
	const size = 100 << 20
	ar := &AccessReport{FileMiB: size >> 20}
	b.r.Access = ar
	if h, err := b.c.Health(ctx); err == nil {
		b.r.Host.Accel, b.r.Host.ServerVersion = h.Accel, h.Version
	}
	vm, err := b.create(ctx)
	if err != nil {
		return err
	}
	src := filepath.Join(b.tmp, "src.bin")
	f, err := os.Create(src)
	if err != nil {
		return err
	}
	io.Copy(f, io.LimitReader(rand.New(rand.NewSource(42)), size))
	f.Close()
	want, _ := fileSHA(src)
	checkVM := func(p string) error {
		r, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: "sha256sum " + p + " | cut -d' ' -f1; rm -f " + p})
		if err != nil {
			return err
		}
		if strings.TrimSpace(r.Stdout) != want {
			return fmt.Errorf("%s in the VM has sha %q, want %s", p, r.Stdout, want)
		}
		return nil
	}
	checkLocal := func(p string) error {
		got, err := fileSHA(p)
		if err == nil && got != want {
			err = fmt.Errorf("%s: sha %s, want %s", p, got, want)
		}
		os.Remove(p)
		return err
	}
	// best of two runs each way: the first also warms the guest page cache
	best := func(name string, run func() (time.Duration, error)) (float64, error) {
		var top float64
		for i := 0; i < 2; i++ {
			d, err := run()
			if err != nil {
				return 0, fmt.Errorf("%s: %w", name, err)
			}
			r := mibs(size, d)
			logf("%s: %.1f MiB/s", name, r)
			top = max(top, r)
		}
		return top, nil
	}

	// files API
	if ar.FilesUpMiBs, err = best("files API upload", func() (time.Duration, error) {
		f, _ := os.Open(src)
		defer f.Close()
		t0 := time.Now()
		_, err := b.c.WriteFile(ctx, vm, "/root/up.bin", f, size, client.WriteOptions{})
		d := time.Since(t0)
		if err == nil {
			err = checkVM("/root/up.bin")
		}
		return d, err
	}); err != nil {
		return err
	}
	if _, err := b.c.WriteFile(ctx, vm, "/root/down.bin", mustOpen(src), size, client.WriteOptions{}); err != nil {
		return err
	}
	dst := filepath.Join(b.tmp, "dst.bin")
	if ar.FilesDownMiBs, err = best("files API download", func() (time.Duration, error) {
		t0 := time.Now()
		rc, _, err := b.c.ReadFile(ctx, vm, "/root/down.bin", 0, -1, client.FileOptions{})
		if err != nil {
			return 0, err
		}
		out, _ := os.Create(dst)
		_, err = io.CopyBuffer(out, rc, make([]byte, 1<<20))
		rc.Close()
		out.Close()
		d := time.Since(t0)
		if err == nil {
			err = checkLocal(dst)
		}
		return d, err
	}); err != nil {
		return err
	}

	// an OpenSSH sshd inside the VM, reached through the daemon's TCP tunnel
	key, fwd, err := b.installSSHD(ctx, vm)
	if err != nil {
		return err
	}
	defer fwd.close()
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return err
	}
	kh := filepath.Join(b.tmp, "ssh", "kh")
	base := []string{"-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
		"-o", "UserKnownHostsFile=" + kh, "-o", "StrictHostKeyChecking=no"}
	scp := func(port int, from, to string) (time.Duration, error) {
		args := append(append([]string{}, base...), "-P", strconv.Itoa(port), from, to)
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, "scp", args...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("scp %v: %v: %s", args, err, out)
		}
		return time.Since(t0), nil
	}
	scpBoth := func(label string, port int, login, dir string) (up, down float64, err error) {
		if up, err = best(label+" upload", func() (time.Duration, error) {
			d, err := scp(port, src, login+"@127.0.0.1:"+dir+"/up.bin")
			if err == nil {
				err = checkVM(dir + "/up.bin")
			}
			return d, err
		}); err != nil {
			return
		}
		down, err = best(label+" download", func() (time.Duration, error) {
			d, err := scp(port, login+"@127.0.0.1:"+dir+"/down.bin", dst)
			if err == nil {
				err = checkLocal(dst)
			}
			return d, err
		})
		return
	}
	if ar.SSHDSCPUpMiBs, ar.SSHDSCPDownMiBs, err = scpBoth("scp to sshd in the VM", fwd.port(), "root", "/root"); err != nil {
		return err
	}
	// the gateway, with the same key registered under an ssh-only token
	info, err := b.c.SSHInfo(ctx)
	if err != nil {
		return err
	}
	gwPort, _ := strconv.Atoi(info.Listen[strings.LastIndex(info.Listen, ":")+1:])
	if _, err := b.c.CreateToken(ctx, api.CreateTokenRequest{VM: vm, Allow: []string{"ssh", "term"}, TTL: "1h", SSHKeys: []string{string(pub)}}); err != nil {
		return err
	}
	if ar.GatewaySCPUpMiBs, ar.GatewaySCPDownMiBs, err = scpBoth("scp through the gateway", gwPort, vm, "/root"); err != nil {
		return err
	}
	if r, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: "install -o agent -g agent -m 644 /root/down.bin /home/agent/down.bin"}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("copy down.bin for agent: %v %+v", err, r)
	}
	if ar.AgentSCPUpMiBs, ar.AgentSCPDownMiBs, err = scpBoth("scp through the gateway as agent", gwPort, vm+"+agent", "/home/agent"); err != nil {
		return err
	}
	ar.FilesVsSSHDUp = ratio(ar.FilesUpMiBs, ar.SSHDSCPUpMiBs)
	ar.FilesVsSSHDDown = ratio(ar.FilesDownMiBs, ar.SSHDSCPDownMiBs)
	ar.GatewayVsSSHDUp = ratio(ar.GatewaySCPUpMiBs, ar.SSHDSCPUpMiBs)
	ar.GatewayVsSSHDDown = ratio(ar.GatewaySCPDownMiBs, ar.SSHDSCPDownMiBs)

	// keystroke echo: one byte to `cat` on a PTY until it comes back
	if ar.EchoTerminal, err = b.echoTerminal(ctx, vm); err != nil {
		return fmt.Errorf("terminal echo: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(mustRead(key))
	if err != nil {
		return err
	}
	if ar.EchoGatewaySSH, err = echoSSH(ctx, fmt.Sprintf("127.0.0.1:%d", gwPort), vm, signer); err != nil {
		return fmt.Errorf("gateway ssh echo: %w", err)
	}
	if ar.EchoSSHD, err = echoSSH(ctx, fmt.Sprintf("127.0.0.1:%d", fwd.port()), "root", signer); err != nil {
		return fmt.Errorf("sshd echo: %w", err)
	}
	return nil
}

func mustOpen(p string) *os.File { f, _ := os.Open(p); return f }
func mustRead(p string) []byte   { b, _ := os.ReadFile(p); return b }

const echoSamples = 100

// echoLoop writes one byte at a time and waits for the byte to come back.
func echoLoop(w io.Writer, r io.Reader) (Stats, error) {
	var d []float64
	buf := make([]byte, 4096)
	for i := 0; i < echoSamples+5; i++ {
		c := byte('a' + i%26)
		t0 := time.Now()
		if _, err := w.Write([]byte{c}); err != nil {
			return Stats{}, err
		}
		for got := false; !got; {
			n, err := r.Read(buf)
			if err != nil {
				return Stats{}, err
			}
			got = strings.IndexByte(string(buf[:n]), c) >= 0
		}
		if i >= 5 {
			d = append(d, msf(time.Since(t0)))
		}
	}
	sort.Float64s(d)
	return summarize(d), nil
}

func (b *bench) echoTerminal(ctx context.Context, vm string) (Stats, error) {
	if _, err := b.c.CreateTerminal(ctx, vm, api.TermCreate{Name: "echo", Argv: []string{"cat"}}); err != nil {
		return Stats{}, err
	}
	defer b.c.KillTerminal(ctx, vm, "echo")
	tm, err := b.c.AttachTerminal(ctx, vm, "echo", client.AttachOptions{NoScrollback: true})
	if err != nil {
		return Stats{}, err
	}
	defer tm.Close()
	time.Sleep(200 * time.Millisecond)
	return echoLoop(tm, tm)
}

// echoSSH opens a PTY session running cat over SSH and times the echo.
func echoSSH(ctx context.Context, addr, user string, signer ssh.Signer) (Stats, error) {
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second}
	c, err := ssh.Dial("tcp", addr, cfg)
	if err != nil {
		return Stats{}, err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return Stats{}, err
	}
	defer s.Close()
	if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		return Stats{}, err
	}
	in, _ := s.StdinPipe()
	out, _ := s.StdoutPipe()
	if err := s.Start("cat"); err != nil {
		return Stats{}, err
	}
	time.Sleep(300 * time.Millisecond)
	return echoLoop(in, out)
}

// PrintAccess prints the -access report.
func (r *Report) PrintAccess(w io.Writer) {
	fmt.Fprintf(w, "\nagentvm interactive-access benchmark (%s, %d cores, QEMU %s)\n\n", r.Host.Accel, r.Host.NProc, r.Host.QEMUVersion)
	a := r.Access
	if a != nil {
		fmt.Fprintf(w, "%d MiB transfer, best of 2, MiB/s            upload   download\n", a.FileMiB)
		fmt.Fprintf(w, "  files API (HTTP -> agent)                 %7.1f   %7.1f\n", a.FilesUpMiBs, a.FilesDownMiBs)
		fmt.Fprintf(w, "  scp through the agentvm SSH gateway       %7.1f   %7.1f\n", a.GatewaySCPUpMiBs, a.GatewaySCPDownMiBs)
		fmt.Fprintf(w, "  the same as the agent user                %7.1f   %7.1f\n", a.AgentSCPUpMiBs, a.AgentSCPDownMiBs)
		fmt.Fprintf(w, "  scp to OpenSSH sshd in the VM (baseline)  %7.1f   %7.1f\n", a.SSHDSCPUpMiBs, a.SSHDSCPDownMiBs)
		fmt.Fprintf(w, "  files API / sshd scp                      %6.2fx   %6.2fx   (target >= 5x)\n", a.FilesVsSSHDUp, a.FilesVsSSHDDown)
		fmt.Fprintf(w, "  gateway scp / sshd scp                    %6.2fx   %6.2fx   (target >= 1.0x)\n", a.GatewayVsSSHDUp, a.GatewayVsSSHDDown)
		fmt.Fprintf(w, "\nkeystroke echo round trip (one byte to cat on a PTY, n=%d)   p50      p90\n", echoSamples)
		fmt.Fprintf(w, "  terminal over WebSocket                   %6.1f ms %6.1f ms\n", a.EchoTerminal.P50, a.EchoTerminal.P90)
		fmt.Fprintf(w, "  ssh -t through the gateway                %6.1f ms %6.1f ms\n", a.EchoGatewaySSH.P50, a.EchoGatewaySSH.P90)
		fmt.Fprintf(w, "  ssh -t to sshd in the VM (baseline)       %6.1f ms %6.1f ms\n", a.EchoSSHD.P50, a.EchoSSHD.P90)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "ERROR: %s\n", e)
	}
}
