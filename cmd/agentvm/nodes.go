package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func nodeCmd() *cobra.Command {
	c := &cobra.Command{Use: "node", Short: "The nodes of a cluster (serve --cluster)"}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the cluster's nodes: address, lease, capacity and what saved states they can restore",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, err := client.FromEnv().ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ns)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tADDRESS\tSTATUS\tLEASE\tGENERATION\tCPUS\tMEMORY\tQEMU\tMACHINE\tACCEL")
			for _, n := range ns {
				status := "alive"
				if !n.Alive {
					status = "gone"
				} else if n.Draining {
					status = "draining"
				}
				if n.Self {
					status += " (this one)"
				}
				lease := (time.Duration(n.LeaseLeftMs) * time.Millisecond).Round(time.Second).String()
				if !n.Alive {
					lease = "ran out " + (-time.Duration(n.LeaseLeftMs) * time.Millisecond).Round(time.Second).String() + " ago"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%dM\t%s\t%s\t%s\n", n.Name, n.Address, status, lease, n.Generation,
					n.CPUs, n.MemoryMiB, n.QEMUVersion, n.MachineType, n.Accel)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NODE",
		Short: "Remove a node whose lease has run out from the cluster's list",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().RemoveNode(cmd.Context(), args[0])
		},
	}
	drain := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move a live node's VMs to other nodes (suspend, store in the object store, wake there) and keep new VMs off it until it restarts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := client.FromEnv().DrainNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(res)
			}
			left := 0
			for _, v := range res.VMs {
				if v.Error != "" {
					left++
					fmt.Printf("%s (%s): stays on %s: %s\n", v.Name, v.State, res.Node, v.Error)
				} else {
					fmt.Printf("%s: moved to %s (%s)\n", v.Name, v.To, v.State)
				}
			}
			if left > 0 {
				return fmt.Errorf("%d of %d VMs stay on %s", left, len(res.VMs), res.Node)
			}
			return nil
		},
	}
	drain.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(ls, rm, drain)
	return c
}
