package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func parseKV(list []string, what string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("invalid %s %q: want KEY=VALUE", what, kv)
		}
		m[k] = v
	}
	return m, nil
}

func createCmd() *cobra.Command {
	var (
		req          api.CreateVMRequest
		memory, disk string
		labels, env  []string
		asJSON       bool
		eg           egressFlags
		idle, del    time.Duration
	)
	c := &cobra.Command{
		Use:   "create",
		Short: "Create a running VM (restored from the image's template snapshot)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.From != "" || req.Template != "" {
				if !cmd.Flags().Changed("memory") {
					memory = ""
				}
				if !cmd.Flags().Changed("cpus") {
					req.CPUs = 0
				}
				if !cmd.Flags().Changed("disk") {
					disk = ""
				}
			}
			if memory != "" {
				if req.Memory, err = api.ParseSize(memory); err != nil {
					return fmt.Errorf("--memory: %w", err)
				}
			}
			if disk != "" {
				if req.Disk, err = api.ParseSize(disk); err != nil {
					return fmt.Errorf("--disk: %w", err)
				}
			}
			if req.Labels, err = parseKV(labels, "label"); err != nil {
				return err
			}
			if req.Env, err = parseKV(env, "env"); err != nil {
				return err
			}
			req.Egress = eg.policy()
			req.IdleTimeout, req.DeleteAfter = api.Duration(idle), api.Duration(del)
			v, err := client.FromEnv().CreateVM(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(v)
			}
			fmt.Println(v.Name)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&req.Name, "name", "", "VM name (hostname); default: its id")
	f.IntVar(&req.CPUs, "cpus", 1, "vCPUs")
	f.StringVar(&memory, "memory", "1024", "memory (MiB, or with K/M/G suffix)")
	f.StringVar(&disk, "disk", "8G", "disk size (MiB, or with K/M/G suffix)")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE for every exec (repeatable)")
	f.StringVar(&req.IdempotencyKey, "idempotency-key", "", "a retried create with the same key returns the same VM")
	f.StringVar(&req.From, "from", "", "create from a snapshot (its processes and files, a fresh identity)")
	f.StringVar(&req.Image, "image", "", "image: default, or code-interpreter (Python, Node.js and bash contexts; see run-code)")
	f.StringVar(&req.Template, "template", "", "create from a template built with agentvm template build, NAME or NAME:TAG (its start command already running)")
	f.BoolVar(&asJSON, "json", false, "print the VM as JSON")
	f.StringVar(&req.Network, "network", "", "put the VM on this private network")
	f.DurationVar(&idle, "idle-timeout", 0, "suspend after this long without activity (API, exec, terminals, SSH, preview); 0 = never")
	f.DurationVar(&del, "delete-after", 0, "delete this long after creation; 0 = never")
	f.StringVar(&req.Restart, "restart", "", "restart policy when QEMU dies: never (default), on-failure, always")
	f.StringVar(&req.Repo, "repo", "", "clone a hosted repository, NAME or NAME@BRANCH, into the VM (it then pushes and pulls there with no credential; see agentvm repo)")
	f.BoolVar(&req.NoRecord, "no-record", false, "do not record the VM's terminal sessions and execs (see agentvm record)")
	f.StringVar(&req.RepoDir, "repo-dir", "", "where --repo is cloned (default /home/agent/NAME)")
	f.StringVar(&req.AntiAffinity, "anti-affinity", "", "on a cluster: a label key (set with --label); the VM prefers a node where no running VM has the same value of it, when one has room")
	eg.add(c)
	return c
}

func lsCmd() *cobra.Command {
	var asJSON bool
	var labels []string
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List VMs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vms, err := client.FromEnv().ListVMs(cmd.Context(), labels...)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(vms)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			cluster := slices.ContainsFunc(vms, func(v api.VM) bool { return v.Node != "" })
			head := "ID\tNAME\tSTATE\tCPUS\tMEMORY\tDISK\tIP\tAGE"
			if cluster {
				head += "\tNODE"
			}
			fmt.Fprintln(tw, head)
			for _, v := range vms {
				state := string(v.State)
				if v.NodeLost {
					state = "lost (was " + state + ")"
					if v.StoredAt != nil {
						state = fmt.Sprintf("lost (was %s, stored %s ago: wakes on another node)", v.State, time.Since(*v.StoredAt).Round(time.Second))
					} else if r := v.RevivesFrom; r != nil {
						state = fmt.Sprintf("lost (was %s: comes back on another node from snapshot %s, taken %s ago)", v.State, r.Snapshot, time.Since(r.TakenAt).Round(time.Second))
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%s\t%s\t%s", v.ID, v.Name, state, v.CPUs, v.MemoryMiB,
					api.Size(v.DiskBytes), v.IP, time.Since(v.CreatedAt).Round(time.Second))
				if cluster {
					fmt.Fprintf(tw, "\t%s", v.Node)
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringArrayVar(&labels, "label", nil, "filter by label KEY=VALUE or KEY (repeatable)")
	return c
}

func inspectCmd() *cobra.Command {
	var wake bool
	c := &cobra.Command{
		Use:   "inspect VM",
		Short: "Show a VM as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			get := client.FromEnv().GetVM
			if wake {
				get = client.FromEnv().WakeVM
			}
			v, err := get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(v)
		},
	}
	c.Flags().BoolVar(&wake, "wake", false, "wake the VM first if it is paused or suspended")
	return c
}

func rmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm VM...",
		Aliases: []string{"delete"},
		Short:   "Delete VMs (process, disk and record)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := client.FromEnv()
			for _, id := range args {
				if err := c.DeleteVM(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Println(id)
			}
			return nil
		},
	}
}

func lifecycleCmd(use, short string, op func(*client.Client, *cobra.Command, string) (*api.VM, error)) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   use + " VM",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := op(client.FromEnv(), cmd, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(v)
			}
			fmt.Printf("%s %s\n", v.Name, v.State)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the VM as JSON")
	return c
}

func startCmd() *cobra.Command {
	return lifecycleCmd("start", "Boot a stopped VM from its disk", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		return c.StartVM(cmd.Context(), id)
	})
}

func stopCmd() *cobra.Command {
	return lifecycleCmd("stop", "Shut a VM down (ACPI, then quit, then kill); the disk is kept", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		return c.StopVM(cmd.Context(), id)
	})
}

func logsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logs VM",
		Short: "Print the VM's serial console and QEMU log",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := client.FromEnv().Logs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			_, err = io.WriteString(os.Stdout, s)
			return err
		},
	}
}

func execCmd() *cobra.Command {
	var (
		req         api.ExecRequest
		env         []string
		timeout     time.Duration
		interactive bool
		shell       bool
		detach      bool
	)
	c := &cobra.Command{
		Use:   "exec VM [flags] -- CMD [ARGS...]",
		Short: "Run a command in a VM; exits with its exit code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = parseKV(env, "env"); err != nil {
				return err
			}
			req.Timeout = api.Duration(timeout)
			if shell {
				req.Shell = strings.Join(args[1:], " ")
			} else {
				req.Cmd = args[1:]
			}
			if detach {
				j, err := client.FromEnv().StartJob(cmd.Context(), args[0], req)
				if err != nil {
					return err
				}
				fmt.Println(j.ID)
				fmt.Fprintf(os.Stderr, "job %s started (pid %d): agentvm job logs %s %s [-f] | job wait | job kill\n", j.ID, j.PID, args[0], j.ID)
				return nil
			}
			var stdin io.Reader
			if interactive || !term.IsTerminal(int(os.Stdin.Fd())) {
				stdin = os.Stdin
			}
			st, err := runExec(args[0], req, stdin)
			if err != nil {
				return err
			}
			if st.TimedOut {
				fmt.Fprintf(os.Stderr, "agentvm: command timed out after %s\n", timeout)
			}
			if st.Signal != "" {
				return exitError{128 + signalNumber(st.Signal)}
			}
			if st.ExitCode != 0 {
				return exitError{st.ExitCode}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&req.User, "user", "u", "", "user to run as (root or agent; default root)")
	f.StringVarP(&req.Cwd, "cwd", "w", "", "working directory (default: the user's home)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command's process group after this long (default: no timeout)")
	f.BoolVarP(&interactive, "interactive", "i", false, "forward stdin even when it is a terminal")
	f.BoolVar(&shell, "sh", false, "run the arguments as one shell string with /bin/sh -c")
	f.BoolVarP(&detach, "detach", "d", false, "start it as a job in the VM and print its id (output kept in the VM; see agentvm job)")
	return c
}

var signalNumbers = map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12, "SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15}

func signalNumber(name string) int {
	if n, ok := signalNumbers[name]; ok {
		return n
	}
	return 0
}

func versionCmd() *cobra.Command {
	return &cobra.Command{Use: "version", Short: "Print the version", Args: cobra.NoArgs, Run: func(*cobra.Command, []string) {
		fmt.Println("agentvm", "0.1.0-dev")
	}}
}
