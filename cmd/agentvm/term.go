package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// parseDetachKey turns "ctrl-]" / "ctrl-\" / "ctrl-a" / "none" into a byte (0 = none).
func parseDetachKey(s string) (byte, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "none" || s == "" {
		return 0, nil
	}
	k, ok := strings.CutPrefix(s, "ctrl-")
	if !ok || len(k) != 1 {
		return 0, fmt.Errorf("detach key %q: want ctrl-X (e.g. ctrl-] or ctrl-q) or none", s)
	}
	c := k[0]
	switch {
	case c >= 'a' && c <= 'z':
		return c - 'a' + 1, nil
	case c >= '[' && c <= '_':
		return c - '[' + 27, nil
	}
	return 0, fmt.Errorf("detach key %q: want ctrl-a..ctrl-z, ctrl-[, ctrl-\\, ctrl-], ctrl-^ or ctrl-_", s)
}

func termCmd() *cobra.Command {
	var (
		session, user, detach string
		list, kill            bool
	)
	c := &cobra.Command{
		Use:   "term VM [-- CMD [ARGS...]]",
		Short: "Attach this terminal to a persistent terminal session in the VM (created if missing)",
		Long: "Attaches to the named terminal session inside the VM, creating it (the user's login shell, or CMD)\n" +
			"if it does not exist. The session lives in the VM: detach with the detach key (default Ctrl-])\n" +
			"or close the window and its programs keep running; attach again to find them with their output.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := client.FromEnv()
			ctx := cmd.Context()
			vm := args[0]
			if list {
				ts, err := cl.ListTerminals(ctx, vm)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tUSER\tPID\tSIZE\tCLIENTS\tSTATUS\tCOMMAND")
				for _, t := range ts {
					st := "running"
					if t.Exited {
						st = fmt.Sprintf("exited %d", t.ExitCode)
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%dx%d\t%d\t%s\t%s\n", t.Name, t.User, t.PID, t.Cols, t.Rows, t.Clients, st, strings.Join(t.Argv, " "))
				}
				return tw.Flush()
			}
			if kill {
				return cl.KillTerminal(ctx, vm, session)
			}
			dk, err := parseDetachKey(detach)
			if err != nil {
				return err
			}
			inFd := int(os.Stdin.Fd())
			isTTY := term.IsTerminal(inFd)
			cols, rows := 80, 24
			if isTTY {
				if w, h, err := term.GetSize(inFd); err == nil {
					cols, rows = w, h
				}
			}
			t, err := cl.GetTerminal(ctx, vm, session)
			switch {
			case client.IsNotFound(err):
				t = nil
			case err != nil:
				return err
			case t.Exited:
				fmt.Fprintf(os.Stderr, "[session %s had exited with code %d; starting a new one]\r\n", session, t.ExitCode)
				if err := cl.KillTerminal(ctx, vm, session); err != nil && !client.IsNotFound(err) {
					return err
				}
				t = nil
			}
			if t == nil {
				envTerm := os.Getenv("TERM")
				req := api.TermCreate{Name: session, Argv: args[1:], User: user, Cols: cols, Rows: rows}
				if envTerm != "" {
					req.Env = map[string]string{"TERM": envTerm}
				}
				if _, err := cl.CreateTerminal(ctx, vm, req); err != nil {
					var ae *client.APIError
					if !(asAPIError(err, &ae) && ae.Status == 409) { // created concurrently: attach to it
						return err
					}
				}
			}
			tm, err := cl.AttachTerminal(ctx, vm, session, client.AttachOptions{Cols: cols, Rows: rows})
			if err != nil {
				return err
			}
			defer tm.Close()
			if isTTY {
				old, err := term.MakeRaw(inFd)
				if err != nil {
					return err
				}
				defer term.Restore(inFd, old)
				winch := make(chan os.Signal, 1)
				signal.Notify(winch, syscall.SIGWINCH)
				defer signal.Stop(winch)
				go func() {
					for range winch {
						if w, h, err := term.GetSize(inFd); err == nil {
							tm.Resize(w, h)
						}
					}
				}()
			}
			detached := make(chan struct{})
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := os.Stdin.Read(buf)
					if n > 0 {
						p := buf[:n]
						if dk != 0 && isTTY {
							if i := bytes.IndexByte(p, dk); i >= 0 {
								if i > 0 {
									tm.Write(p[:i])
								}
								close(detached)
								tm.Close()
								return
							}
						}
						if _, werr := tm.Write(p); werr != nil {
							return
						}
					}
					if err != nil {
						if !isTTY {
							return // stdin ended: stay attached until the program ends
						}
						return
					}
				}
			}()
			_, err = io.Copy(os.Stdout, tm)
			select {
			case <-detached:
				fmt.Fprintf(os.Stderr, "\r\n[detached from session %s; `agentvm term %s --session %s` attaches again]\r\n", session, vm, session)
				return nil
			default:
			}
			if ex := tm.Exit(); ex != nil {
				if isTTY {
					fmt.Fprintf(os.Stderr, "\r\n[session %s exited with code %d]\r\n", session, ex.ExitCode)
				}
				if ex.ExitCode != 0 {
					return exitError{ex.ExitCode}
				}
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "\r\n[connection to session %s closed]\r\n", session)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&session, "session", "main", "session name")
	f.StringVar(&user, "user", "", "guest user for a new session (default root, or the token's user)")
	f.StringVar(&detach, "detach-key", "ctrl-]", "key that detaches (ctrl-X or none)")
	f.BoolVar(&list, "ls", false, "list the VM's terminal sessions instead")
	f.BoolVar(&kill, "kill", false, "end the session and its programs instead")
	return c
}
