package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func printEvent(e api.Event) {
	fmt.Printf("%s  %-9s %-16s %s\n", e.Time.Local().Format("2006-01-02 15:04:05.000"), e.Type, e.Actor, e.Message)
}

func eventsCmd() *cobra.Command {
	var follow, asJSON bool
	c := &cobra.Command{
		Use:   "events VM",
		Short: "Show a VM's event log (lifecycle, exec, terminals, SSH, services, policies)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := client.FromEnv()
			v, err := cl.GetVM(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if follow {
				return cl.FollowEvents(cmd.Context(), v.ID, 0, func(e api.Event) error {
					if asJSON {
						return printJSON(e)
					}
					printEvent(e)
					return nil
				})
			}
			es, err := cl.Events(cmd.Context(), v.ID, 0)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(es)
			}
			for _, e := range es {
				printEvent(e)
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func policyCmd() *cobra.Command {
	var idle, del, restart string
	c := &cobra.Command{
		Use:     "policy VM",
		Short:   "Change a VM's idle timeout, delete-after and restart policy",
		Example: "  agentvm policy box1 --idle-timeout 15m --restart on-failure\n  agentvm policy box1 --idle-timeout 0   # never suspend",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.PolicyRequest
			parse := func(flag, s string) (*api.Duration, error) {
				if !cmd.Flags().Changed(flag) {
					return nil, nil
				}
				if s == "0" || s == "never" {
					d := api.Duration(0)
					return &d, nil
				}
				d, err := time.ParseDuration(s)
				if err != nil || d < 0 {
					return nil, fmt.Errorf("--%s: want a duration like 15m, 0 or never, got %q", flag, s)
				}
				ad := api.Duration(d)
				return &ad, nil
			}
			var err error
			if req.IdleTimeout, err = parse("idle-timeout", idle); err != nil {
				return err
			}
			if req.DeleteAfter, err = parse("delete-after", del); err != nil {
				return err
			}
			if cmd.Flags().Changed("restart") {
				req.Restart = &restart
			}
			if req.IdleTimeout == nil && req.DeleteAfter == nil && req.Restart == nil {
				return fmt.Errorf("give --idle-timeout, --delete-after or --restart")
			}
			v, err := client.FromEnv().SetPolicy(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Printf("%s: idle timeout %s, delete after %s, restart %s\n", v.Name, secs(v.IdleTimeoutSec), secs(v.DeleteAfterSec), orDefault(v.Restart, "never"))
			return nil
		},
	}
	c.Flags().StringVar(&idle, "idle-timeout", "", "suspend after this long without activity (0: never)")
	c.Flags().StringVar(&del, "delete-after", "", "delete this long after creation (0: never)")
	c.Flags().StringVar(&restart, "restart", "", "never, on-failure or always")
	return c
}

func secs(s int64) string {
	if s == 0 {
		return "never"
	}
	return (time.Duration(s) * time.Second).String()
}

func orDefault(s, d string) string {
	if strings.TrimSpace(s) == "" {
		return d
	}
	return s
}
