package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func serviceCmd() *cobra.Command {
	c := &cobra.Command{Use: "service", Short: "Services in a VM, supervised by its systemd"}
	var (
		req    api.ServiceCreate
		env    []string
		shell  bool
		asJSON bool
	)
	create := &cobra.Command{
		Use:   "create VM NAME [flags] -- CMD [ARGS...]",
		Short: "Create a service (started now and at every boot unless told otherwise)",
		Args:  cobra.MinimumNArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = parseKV(env, "env"); err != nil {
				return err
			}
			req.Name = args[1]
			if shell {
				req.Shell = strings.Join(args[2:], " ")
			} else {
				req.Argv = args[2:]
			}
			s, err := client.FromEnv().CreateService(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s)
			}
			fmt.Printf("%s: %s/%s (pid %d)\n", s.Name, s.ActiveState, s.SubState, s.MainPID)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&req.Restart, "restart", "", "no, on-failure (default) or always")
	f.StringVar(&req.Type, "type", "", "simple (default, long-running) or oneshot")
	f.StringVarP(&req.User, "user", "u", "", "user to run as (default root)")
	f.StringVarP(&req.Cwd, "cwd", "w", "", "working directory (default: the user's home)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.BoolVar(&req.NoBoot, "no-boot", false, "do not start it at boot")
	f.BoolVar(&req.NoStart, "no-start", false, "create it without starting it now")
	f.BoolVar(&shell, "sh", false, "run the arguments as one shell string with /bin/sh -c")
	f.BoolVar(&asJSON, "json", false, "print JSON")

	var lsJSON bool
	ls := &cobra.Command{
		Use:   "ls VM",
		Short: "List services with their state",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ss, err := client.FromEnv().ListServices(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if lsJSON {
				return printJSON(ss)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tPID\tRESTART\tRESTARTS\tUSER\tCOMMAND")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%d\t%s\t%s\n", s.Name, s.ActiveState, s.SubState, s.MainPID, s.Restart, s.Restarts, s.User, strings.Join(s.Argv, " "))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")

	var follow bool
	var lines int
	logs := &cobra.Command{
		Use:   "logs VM NAME",
		Short: "Show a service's journal",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc, err := client.FromEnv().ServiceLogs(cmd.Context(), args[0], args[1], lines, follow)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(os.Stdout, rc)
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines")
	logs.Flags().IntVarP(&lines, "lines", "n", 200, "how many recent lines")
	c.AddCommand(create, ls, logs)
	for _, a := range []string{"start", "stop", "restart"} {
		c.AddCommand(&cobra.Command{
			Use:   a + " VM NAME",
			Short: strings.ToUpper(a[:1]) + a[1:] + " a service",
			Args:  cobra.ExactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				s, err := client.FromEnv().ServiceAction(cmd.Context(), args[0], args[1], a)
				if err != nil {
					return err
				}
				fmt.Printf("%s: %s/%s\n", s.Name, s.ActiveState, s.SubState)
				return nil
			},
		})
	}
	c.AddCommand(&cobra.Command{
		Use:     "rm VM NAME",
		Aliases: []string{"remove"},
		Short:   "Stop and remove a service",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().DeleteService(cmd.Context(), args[0], args[1])
		},
	})
	return c
}

func psCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ps VM",
		Short: "List the processes in a VM",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := client.FromEnv().ListProcesses(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ps)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PID\tPPID\tUSER\tS\t%CPU\tRSS\tCOMMAND")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.1f\t%s\t%s\n", p.PID, p.PPID, p.User, p.State, p.CPUPercent, mibStr(p.RSSBytes), p.Command)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func mibStr(b int64) string { return fmt.Sprintf("%.1fM", float64(b)/(1<<20)) }

func killCmd() *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "kill VM PID",
		Short: "Send a signal to a process in a VM (default TERM)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PID must be a number, got %q", args[1])
			}
			return client.FromEnv().SignalProcess(cmd.Context(), args[0], pid, sig)
		},
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number")
	return c
}

func jobCmd() *cobra.Command {
	c := &cobra.Command{Use: "job", Short: "Detached execs (agentvm exec --detach): output kept in the VM"}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls VM",
		Short: "List jobs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			js, err := client.FromEnv().ListJobs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(js)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPID\tSTATUS\tSTARTED\tCOMMAND")
			for _, j := range js {
				st := "running"
				if j.Exited {
					st = fmt.Sprintf("exited %d", j.ExitCode)
					if j.Signal != "" {
						st = "killed by " + j.Signal
					}
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", j.ID, j.PID, st, j.StartedAt.Local().Format(time.DateTime), strings.Join(j.Argv, " "))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var follow bool
	var stream string
	logs := &cobra.Command{
		Use:   "logs VM JOB",
		Short: "Print a job's output (-f: follow it until the job exits)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc, err := client.FromEnv().JobLogs(cmd.Context(), args[0], args[1], stream, 0, follow)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(os.Stdout, rc)
			return err
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "follow until the job exits")
	logs.Flags().StringVar(&stream, "stream", "stdout", "stdout, stderr or both (both cannot follow)")
	wait := &cobra.Command{
		Use:   "wait VM JOB",
		Short: "Wait for a job to exit; exits with its exit code",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			j, err := client.FromEnv().WaitJob(cmd.Context(), args[0], args[1], 0)
			if err != nil {
				return err
			}
			if j.ExitCode != 0 {
				return exitError{j.ExitCode}
			}
			return nil
		},
	}
	var sig string
	kill := &cobra.Command{
		Use:   "kill VM JOB",
		Short: "Signal every process of a job (default TERM)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().SignalJob(cmd.Context(), args[0], args[1], sig)
		},
	}
	kill.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name or number")
	rm := &cobra.Command{
		Use:   "rm VM JOB",
		Short: "Remove a job and its output (killing it if it runs)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().DeleteJob(cmd.Context(), args[0], args[1])
		},
	}
	c.AddCommand(ls, logs, wait, kill, rm)
	return c
}
