package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func pauseCmd() *cobra.Command {
	return lifecycleCmd("pause", "Freeze a VM's vCPUs (memory stays in RAM)", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		return c.PauseVM(cmd.Context(), id)
	})
}

func resumeCmd() *cobra.Command {
	return lifecycleCmd("resume", "Continue a paused VM", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		return c.ResumeVM(cmd.Context(), id)
	})
}

func suspendCmd() *cobra.Command {
	return lifecycleCmd("suspend", "Save a VM's memory to disk and free its RAM; the next request wakes it", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		return c.SuspendVM(cmd.Context(), id)
	})
}

func resizeCmd() *cobra.Command {
	var (
		cpus         int
		memory, disk string
	)
	c := lifecycleCmd("resize", "Grow a VM: disk, vCPUs (up to 16) and memory (up to 16 GiB more) online; the rest at the next start", func(c *client.Client, cmd *cobra.Command, id string) (*api.VM, error) {
		req := api.ResizeRequest{CPUs: cpus}
		var err error
		if memory != "" {
			if req.Memory, err = api.ParseSize(memory); err != nil {
				return nil, fmt.Errorf("--memory: %w", err)
			}
		}
		if disk != "" {
			if req.Disk, err = api.ParseSize(disk); err != nil {
				return nil, fmt.Errorf("--disk: %w", err)
			}
		}
		v, err := c.ResizeVM(cmd.Context(), id, req)
		if err == nil && v.Op != nil {
			fmt.Fprintln(os.Stderr, v.Op.Message)
		}
		return v, err
	})
	c.Flags().IntVar(&cpus, "cpus", 0, "vCPUs")
	c.Flags().StringVar(&memory, "memory", "", "memory (MiB, or with K/M/G suffix)")
	c.Flags().StringVar(&disk, "disk", "", "disk size (grow only)")
	return c
}

func forkCmd() *cobra.Command {
	var count int
	var asJSON bool
	c := &cobra.Command{
		Use:   "fork VM",
		Short: "Copy a running VM (memory, processes, disk) into new running VMs; the parent keeps running",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := client.FromEnv().Fork(cmd.Context(), args[0], count)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(res.Children)
			}
			for _, v := range res.Children {
				fmt.Println(v.Name)
			}
			fmt.Fprintf(os.Stderr, "parent paused %d ms; %d MiB of state; %d ms in all\n", res.ParentPauseMs, res.StateBytes>>20, res.TookMs)
			return nil
		},
	}
	c.Flags().IntVar(&count, "count", 1, "number of children")
	c.Flags().BoolVar(&asJSON, "json", false, "print the children as a JSON array")
	return c
}

func snapshotCmd() *cobra.Command {
	var name string
	var asJSON bool
	c := &cobra.Command{
		Use:   "snapshot VM",
		Short: "Capture a running or paused VM (memory, processes, disk); also: snapshot inspect|rm S",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := client.FromEnv().Snapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(s)
			}
			fmt.Println(s.Name)
			fmt.Fprintf(os.Stderr, "guest paused %d ms; %d MiB of state\n", s.PausedMs, s.Bytes>>20)
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", "", "snapshot name (default: its id)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(&cobra.Command{
		Use: "inspect SNAPSHOT", Short: "Show a snapshot as JSON", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := client.FromEnv().GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(s)
		},
	}, &cobra.Command{
		Use: "rm SNAPSHOT...", Short: "Delete snapshots", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				if err := client.FromEnv().DeleteSnapshot(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println(a)
			}
			return nil
		},
	})
	return c
}

func snapshotsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "snapshots",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ss, err := client.FromEnv().ListSnapshots(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ss)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			// A cluster's snapshots say where they are kept: on a node, and
			// in the object store once stored.
			where := false
			for _, s := range ss {
				where = where || s.Node != "" || s.StoredAt != nil
			}
			head := "ID\tNAME\tVM\tMEMORY\tSTATE\tPAUSED\tCREATED"
			if where {
				head += "\tNODE\tSTORED"
			}
			fmt.Fprintln(tw, head)
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dM\t%dM\t%dms\t%s", s.ID, s.Name, s.VMName, s.MemoryMiB, s.Bytes>>20, s.PausedMs, s.CreatedAt.Format("2006-01-02 15:04:05"))
				if where {
					stored := "-"
					if s.StoredAt != nil {
						stored = s.StoredAt.Format("2006-01-02 15:04:05")
					}
					fmt.Fprintf(tw, "\t%s\t%s", s.Node, stored)
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
