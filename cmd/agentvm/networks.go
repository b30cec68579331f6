package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

// egressFlags are the egress policy flags of create, egress and network create.
type egressFlags struct {
	mode      string
	allow     []string
	allowHost []int
}

func (f *egressFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.mode, "egress", "", "egress policy: public (the internet; private ranges and the host blocked), deny or allow")
	c.Flags().StringArrayVar(&f.allow, "allow", nil, "with --egress allow: a CIDR, an IP or a domain (and its subdomains) the VM may reach (repeatable)")
	c.Flags().IntSliceVar(&f.allowHost, "allow-host", nil, "host loopback port the VM may reach at host.agentvm.internal (repeatable)")
}

// policy returns nil when no egress flag was given.
func (f *egressFlags) policy() *api.Egress {
	if f.mode == "" && len(f.allow) == 0 && len(f.allowHost) == 0 {
		return nil
	}
	e := &api.Egress{Mode: f.mode, Allow: f.allow, AllowHost: f.allowHost}
	if e.Mode == "" && len(e.Allow) > 0 {
		e.Mode = "allow"
	}
	return e
}

func describe(e *api.Egress) string {
	if e == nil {
		return "public (default)"
	}
	d := e.Mode
	if d == "" {
		d = "public"
	}
	if len(e.Allow) > 0 {
		d += " " + strings.Join(e.Allow, ",")
	}
	if len(e.AllowHost) > 0 {
		d += fmt.Sprintf(" host ports %v", e.AllowHost)
	}
	return d
}

func egressCmd() *cobra.Command {
	var f egressFlags
	var clear bool
	c := &cobra.Command{
		Use:   "egress VM",
		Short: "Set a VM's egress policy (applies at once to new connections)",
		Example: "  agentvm egress box1 --egress deny\n  agentvm egress box1 --egress allow --allow deb.debian.org --allow 203.0.113.0/24\n" +
			"  agentvm egress box1 --allow-host 5432      # the host's 127.0.0.1:5432 at host.agentvm.internal:5432\n  agentvm egress box1 --clear",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e := f.policy()
			if clear {
				e = nil
			} else if e == nil {
				return fmt.Errorf("give --egress, --allow, --allow-host or --clear")
			}
			v, err := client.FromEnv().SetEgress(cmd.Context(), args[0], e)
			if err != nil {
				return err
			}
			fmt.Printf("%s: egress %s\n", v.Name, describe(v.Egress))
			return nil
		},
	}
	f.add(c)
	c.Flags().BoolVar(&clear, "clear", false, "drop the VM's own policy (its network's applies, else public)")
	return c
}

func networkCmd() *cobra.Command {
	c := &cobra.Command{Use: "network", Short: "Private networks: VMs on one reach each other by IP and name"}
	var f egressFlags
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a private network",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := client.FromEnv().CreateNetwork(cmd.Context(), api.CreateNetworkRequest{Name: args[0], Egress: f.policy()})
			if err != nil {
				return err
			}
			fmt.Println(n.Name)
			return nil
		},
	}
	f.add(create)
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List private networks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, err := client.FromEnv().ListNetworks(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ns)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tEGRESS\tVMS")
			for _, n := range ns {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Name, describe(n.Egress), strings.Join(n.VMs, ","))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete an empty private network",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().DeleteNetwork(cmd.Context(), args[0])
		},
	}
	attach := &cobra.Command{
		Use:   "attach VM NAME",
		Short: "Put a VM on a private network",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := client.FromEnv().AttachNetwork(cmd.Context(), args[0], args[1])
			return err
		},
	}
	detach := &cobra.Command{
		Use:   "detach VM [NAME]",
		Short: "Take a VM off its private network",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := client.FromEnv().AttachNetwork(cmd.Context(), args[0], "")
			return err
		},
	}
	var ef egressFlags
	egress := &cobra.Command{
		Use:   "egress NAME",
		Short: "Set a network's egress policy (its VMs without their own policy follow it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e := ef.policy()
			if e == nil {
				e = &api.Egress{Mode: "public"}
			}
			_, err := client.FromEnv().SetNetworkEgress(cmd.Context(), args[0], *e)
			return err
		},
	}
	ef.add(egress)
	c.AddCommand(create, ls, rm, attach, detach, egress)
	return c
}
