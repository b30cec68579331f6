// Command agentvm is the agentvm daemon (`agentvm serve`) and CLI.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

// exitError carries a process exit code (exec exits with the command's code).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	if len(os.Args) == 3 && (os.Args[1] == qemu.StateCatArg || os.Args[1] == qemu.StateCatEagerArg) { // QEMU reading a state file
		cat := qemu.CatState
		if os.Args[1] == qemu.StateCatEagerArg {
			cat = qemu.CatStateEager
		}
		if err := cat(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "agentvm state-cat:", err)
			os.Exit(1)
		}
		return
	}
	root := newRoot()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	cancel()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "agentvm:", err)
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Status == 404 {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

// newRoot is the whole command tree (docs/cli-reference.md is made from it).
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "agentvm",
		Short:         "Durable, forkable Linux VMs for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), nodeCmd(), caCmd(), mcpCmd(), createCmd(), lsCmd(), inspectCmd(), rmCmd(), startCmd(), stopCmd(),
		execCmd(), logsCmd(), imageCmd(), connectCmd(), versionCmd(),
		pauseCmd(), resumeCmd(), suspendCmd(), resizeCmd(), forkCmd(), snapshotCmd(), snapshotsCmd(),
		tokenCmd(), sshCmd(), termCmd(), cpCmd(), exposeCmd(), unexposeCmd(), portsCmd(), egressCmd(), networkCmd(), eventsCmd(), policyCmd(), serviceCmd(), psCmd(), killCmd(), jobCmd(), runCodeCmd(), codeContextCmd(), screenshotCmd(), templateCmd(), repoCmd(), recordCmd(), diffCmd())
	return root
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func asAPIError(err error, target **client.APIError) bool { return errors.As(err, target) }
