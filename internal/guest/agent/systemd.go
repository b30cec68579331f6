package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// systemd runs systemctl, systemd-run and journalctl. Tests replace it
// (see systemdFor) since they cannot talk to a real service manager.
type systemd struct {
	// run runs a command to completion and returns its standard output; a
	// non-zero exit is an error that carries the command's stderr.
	run func(ctx context.Context, name string, args ...string) ([]byte, error)
	// stream runs a command and copies its standard output to w as it
	// comes, until the command exits or ctx ends (then it is stopped).
	stream func(ctx context.Context, w io.Writer, name string, args ...string) error
}

// systemdFor returns the systemd access used by an agent (tests swap it).
var systemdFor = func(a *Agent) *systemd { return hostSystemd() }

func hostSystemd() *systemd {
	cmd := func(ctx context.Context, name string, args []string) *exec.Cmd {
		c := exec.CommandContext(ctx, name, args...)
		c.Env = append(os.Environ(), "SYSTEMD_PAGER=cat", "SYSTEMD_COLORS=0")
		c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
		c.WaitDelay = 2 * time.Second
		return c
	}
	return &systemd{
		run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			c := cmd(ctx, name, args)
			var stderr bytes.Buffer
			c.Stderr = &limitedBuffer{b: &stderr, max: 16 << 10}
			out, err := c.Output()
			if err != nil {
				return out, cmdError(name, args, err, stderr.Bytes())
			}
			return out, nil
		},
		stream: func(ctx context.Context, w io.Writer, name string, args ...string) error {
			c := cmd(ctx, name, args)
			var stderr bytes.Buffer
			c.Stderr = &limitedBuffer{b: &stderr, max: 16 << 10}
			c.Stdout = w
			if err := c.Run(); err != nil && ctx.Err() == nil {
				return cmdError(name, args, err, stderr.Bytes())
			}
			return nil
		},
	}
}

func cmdError(name string, args []string, err error, stderr []byte) error {
	msg := strings.TrimSpace(string(stderr))
	if msg == "" {
		msg = err.Error()
	}
	verb := name
	if len(args) > 0 {
		verb += " " + args[0]
	}
	return fmt.Errorf("%s: %s", verb, msg)
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		if len(p) < room {
			room = len(p)
		}
		l.b.Write(p[:room])
	}
	return len(p), nil
}

// show runs systemctl show for units and returns one property map per unit,
// in order.
func (sd *systemd) show(ctx context.Context, props string, units ...string) ([]map[string]string, error) {
	args := append([]string{"show"}, units...)
	args = append(args, "-p", props, "--timestamp=unix")
	out, err := sd.run(ctx, "systemctl", args...)
	if err != nil {
		return nil, err
	}
	blocks := parseShow(out)
	if len(blocks) != len(units) {
		return nil, fmt.Errorf("systemctl show: %d units in the output, want %d", len(blocks), len(units))
	}
	return blocks, nil
}

// parseShow parses systemctl show output: key=value lines, one block per
// unit, blocks separated by an empty line.
func parseShow(out []byte) []map[string]string {
	var blocks []map[string]string
	var cur map[string]string
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" {
			if cur != nil {
				blocks = append(blocks, cur)
				cur = nil
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		if cur == nil {
			cur = map[string]string{}
		}
		cur[k] = v
	}
	if cur != nil {
		blocks = append(blocks, cur)
	}
	return blocks
}

// showTime parses a --timestamp=unix value ("@1700000000"; empty when unset).
func showTime(v string) time.Time {
	v = strings.TrimPrefix(strings.TrimSpace(v), "@")
	if v == "" {
		return time.Time{}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return time.Time{}
	}
	sec := int64(f)
	return time.Unix(sec, int64((f-float64(sec))*1e9))
}

func showInt(v string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(v))
	return n
}
