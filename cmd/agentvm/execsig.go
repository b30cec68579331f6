package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// runExec runs a command in the VM like a local one: Ctrl-C, SIGTERM and SIGHUP are
// forwarded to the remote process group, and the CLI waits for it to exit (so it
// exits 130 after Ctrl-C, as a shell would). A third signal drops the connection,
// which makes the guest kill the process group. A signal that comes before
// the process started (while a suspended VM wakes, say) ends the wait at once.
func runExec(vm string, req api.ExecRequest, stdin io.Reader) (*api.ExitStatus, error) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan *client.ExecStream, 1)
	go func() {
		var st *client.ExecStream
		n := 0
		for {
			select {
			case st = <-started:
				continue
			case <-ctx.Done():
				return
			case sig := <-sigs:
				if n++; st == nil || n >= 3 {
					cancel()
					return
				}
				st.Signal(sig.(syscall.Signal))
			}
		}
	}()
	st, err := client.FromEnv().StartExec(ctx, vm, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted before the command started: %w", err)
		}
		return nil, err
	}
	defer st.Close()
	started <- st
	if stdin != nil {
		go func() {
			if _, err := io.Copy(st, stdin); err == nil {
				st.CloseStdin()
			}
		}()
	} else {
		st.CloseStdin()
	}
	return st.Wait(os.Stdout, os.Stderr)
}
