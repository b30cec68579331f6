package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func recordCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "record",
		Short: "Replayable recordings of a VM's terminal sessions (asciicast v2) and execs (JSON lines)",
		Long: "Every terminal session (API, console, CLI, SSH with a PTY) and every exec (API, SDKs, MCP,\n" +
			"SSH commands) is recorded by the daemon from what it relays, unless the VM's recording is off.",
		Example: "  agentvm record ls dev\n  agentvm record get dev term-20261206T101500.000000000-a1b2c3 > s.cast && asciinema play s.cast\n" +
			"  agentvm record export dev -o dev.tar.gz\n  agentvm record off dev",
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls VM",
		Short: "List a VM's recordings, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, err := client.FromEnv().Recordings(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(out)
			}
			if !out.Enabled {
				fmt.Fprintln(os.Stderr, "recording is off for this VM (agentvm record on VM)")
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKIND\tSTART\tDURATION\tSIZE\tBY\tTITLE")
			for _, r := range out.Recordings {
				title := r.Title
				if r.ExitCode != nil {
					title = fmt.Sprintf("%s -> exit %d", title, *r.ExitCode)
				}
				if r.Cut {
					title += " (cut)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Kind, r.Start.Local().Format(time.DateTime),
					(time.Duration(r.DurationMs) * time.Millisecond).Round(time.Millisecond), humanBytes(r.Bytes), r.Actor, title)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	get := &cobra.Command{
		Use:   "get VM ID",
		Short: "Write one recording to stdout: a terminal's asciicast v2 file, or an exec's JSON line",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().Recording(cmd.Context(), args[0], args[1], os.Stdout)
		},
	}
	var outPath string
	export := &cobra.Command{
		Use:   "export VM",
		Short: "Write every recording and the VM's events as one .tar.gz (terminals/*.cast, execs.jsonl, events.jsonl, index.json)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if outPath == "" || outPath == "-" {
				return client.FromEnv().ExportRecordings(cmd.Context(), args[0], os.Stdout)
			}
			f, err := os.Create(outPath)
			if err != nil {
				return err
			}
			if err := client.FromEnv().ExportRecordings(cmd.Context(), args[0], f); err != nil {
				f.Close()
				os.Remove(outPath)
				return err
			}
			return f.Close()
		},
	}
	export.Flags().StringVarP(&outPath, "output", "o", "", "file to write (default stdout)")
	onoff := func(on bool) *cobra.Command {
		use, short := "off VM", "Stop recording a VM's terminals and execs (its forks' too); kept recordings stay"
		if on {
			use, short = "on VM", "Record a VM's terminals and execs again"
		}
		return &cobra.Command{
			Use: use, Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return client.FromEnv().SetRecording(cmd.Context(), args[0], on)
			},
		}
	}
	c.AddCommand(ls, get, export, onoff(true), onoff(false))
	return c
}
