package mcp

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Terminals for interactive programs: terminal_send types into a terminal
// (made on first use), terminal_read shows its recent output once it has
// been quiet for a while. The terminal lives in the guest agent between
// calls; each call attaches and detaches.

const defaultTerminal = "main"

// ansi matches terminal escape sequences (CSI, OSC, and two-byte ones),
// which mean nothing to a model reading the output.
var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]`)

func termName(n string) string {
	if n == "" {
		return defaultTerminal
	}
	return n
}

func (t *tools) termSend(ctx context.Context, in termSendIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Input == "" {
		return nil, fmt.Errorf("input is required (end a command with \\n)")
	}
	name := termName(in.Terminal)
	if _, err := t.c.GetTerminal(ctx, id, name); err != nil {
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != 404 {
			return nil, toolError("terminal_send", err)
		}
		if _, err := t.c.CreateTerminal(ctx, id, api.TermCreate{Name: name, Cols: 120, Rows: 40}); err != nil {
			return nil, toolError("terminal_send", err)
		}
	}
	term, err := t.c.AttachTerminal(ctx, id, name, client.AttachOptions{NoScrollback: true})
	if err != nil {
		return nil, toolError("terminal_send", err)
	}
	defer term.Close()
	if _, err := term.Write([]byte(in.Input)); err != nil {
		return nil, toolError("terminal_send", err)
	}
	return text(fmt.Sprintf("Sent %d bytes to terminal %s. Read the screen with terminal_read.", len(in.Input), name)), nil
}

func (t *tools) termRead(ctx context.Context, in termReadIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	quiet := time.Duration(in.WaitMs) * time.Millisecond
	if in.WaitMs == 0 {
		quiet = 500 * time.Millisecond
	}
	if quiet < 0 || quiet > 10*time.Second {
		return nil, fmt.Errorf("wait_ms must be between 1 and 10000")
	}
	name := termName(in.Terminal)
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	term, err := t.c.AttachTerminal(actx, id, name, client.AttachOptions{})
	if err != nil {
		return nil, toolError("terminal_read", err)
	}
	defer term.Close()
	chunks := make(chan []byte, 64)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := term.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	var out []byte
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	// Output that never goes quiet (a spinner) is read for at most this long.
	limit := time.NewTimer(quiet + 10*time.Second)
	defer limit.Stop()
	ended, busy := false, false
	for waiting := true; waiting; {
		select {
		case c, ok := <-chunks:
			if !ok {
				ended, waiting = true, false
				break
			}
			out = append(out, c...)
			if len(out) > 4*maxShown {
				out = out[len(out)-4*maxShown:]
			}
			timer.Reset(quiet)
		case <-timer.C:
			waiting = false
		case <-limit.C:
			busy, waiting = true, false
		case <-actx.Done():
			waiting = false
		}
	}
	screen := ansi.ReplaceAllString(string(out), "")
	if len(screen) > maxShown {
		screen = "[... older output cut]\n" + tail(screen, maxShown)
	}
	if ended {
		screen += "\n[the terminal's program has exited]"
	} else if busy {
		screen += "\n[output is still arriving]"
	}
	if screen == "" {
		screen = "(no output)"
	}
	return text(screen), nil
}
