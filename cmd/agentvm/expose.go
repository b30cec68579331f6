package main

import (
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func exposeCmd() *cobra.Command {
	var (
		req    api.ExposeRequest
		domain string
		asJSON bool
	)
	c := &cobra.Command{
		Use:   "expose VM PORT",
		Short: "Give a VM port a preview URL (HTTP) or a host port (--tcp)",
		Long: "Without --tcp, prints the preview URL http://PORT-VM.<domain>:<proxy port>/ (every port has one;\n" +
			"expose records it, and --public lets it answer without a token). With --tcp, maps a host port\n" +
			"(loopback unless --host-addr) to the VM port. --domain maps a custom host name to the port.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PORT must be a number, got %q", args[1])
			}
			req.Port = port
			cl := client.FromEnv()
			p, err := cl.Expose(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if domain != "" {
				if _, err := cl.AddDomain(cmd.Context(), api.Domain{Domain: domain, VM: args[0], Port: port}); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(p)
			}
			if p.Kind == "tcp" {
				fmt.Println(p.Host)
			} else {
				fmt.Println(p.URL)
			}
			return nil
		},
	}
	f := c.Flags()
	f.BoolVar(&req.Public, "public", false, "the preview answers without a token")
	f.BoolVar(&req.TCP, "tcp", false, "map a host TCP port to the VM port instead")
	f.IntVar(&req.HostPort, "host-port", 0, "with --tcp: the host port (default: a free one)")
	f.StringVar(&req.HostAddr, "host-addr", "", "with --tcp: the host address to listen on (default 127.0.0.1)")
	f.StringVar(&domain, "domain", "", "also map this host name to the port (point its DNS at the proxy)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func unexposeCmd() *cobra.Command {
	var tcp bool
	c := &cobra.Command{
		Use:   "unexpose VM PORT",
		Short: "Remove a port's exposure (the preview becomes token-only again; --tcp closes the host port)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("PORT must be a number, got %q", args[1])
			}
			kind := "http"
			if tcp {
				kind = "tcp"
			}
			return client.FromEnv().Unexpose(cmd.Context(), args[0], port, kind)
		},
	}
	c.Flags().BoolVar(&tcp, "tcp", false, "remove the TCP mapping")
	return c
}

func portsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ports VM",
		Short: "List a VM's exposed ports",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := client.FromEnv().ListPorts(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ps)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PORT\tKIND\tPUBLIC\tADDRESS")
			for _, p := range ps {
				addr := p.URL
				if p.Kind == "tcp" {
					addr = p.Host
				}
				fmt.Fprintf(tw, "%d\t%s\t%v\t%s\n", p.Port, p.Kind, p.Public, addr)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
