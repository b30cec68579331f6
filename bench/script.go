package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
)

// batchScript is a benchmark script in another language (the SDK
// benchmarks' node and Python drivers) that stays up for the whole run:
// each line written to its stdin is a count of round trips, answered by
// one JSON line of times.
type batchScript struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

// startScript starts argv in dir with the server's URL and token in its
// environment; its stderr goes to ours.
func (b *bench) startScript(ctx context.Context, name, dir string, argv ...string) (*batchScript, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "AGENTVM_URL="+b.srv.url, "AGENTVM_TOKEN="+b.srv.token)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &batchScript{name: name, cmd: cmd, in: in, lines: bufio.NewScanner(out)}, nil
}

// batch asks for n round trips per path and decodes the answer into res.
func (s *batchScript) batch(n int, res any) error {
	if _, err := fmt.Fprintln(s.in, n); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	if !s.lines.Scan() {
		return fmt.Errorf("%s ended: %v", s.name, s.lines.Err())
	}
	if err := json.Unmarshal(s.lines.Bytes(), res); err != nil {
		return fmt.Errorf("%s output %q: %v", s.name, s.lines.Bytes(), err)
	}
	return nil
}

// close ends the script (EOF on its stdin) and waits for it.
func (s *batchScript) close() {
	s.in.Close()
	s.cmd.Wait()
}

// alternate runs n rounds of a then b, swapping which goes first each
// round, so that drifting host conditions hit both alike.
func alternate(n int, a, b func() error) error {
	for i := 0; i < n; i++ {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	return nil
}
