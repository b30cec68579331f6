package main

import (
	"fmt"
	"os"

	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func screenshotCmd() *cobra.Command {
	var out string
	var scale float64
	c := &cobra.Command{
		Use:   "screenshot VM",
		Short: "Save a PNG of a browser VM's display (-o FILE, - for stdout)",
		Example: `  agentvm create --image browser --name b1
  agentvm screenshot b1 -o shot.png
  agentvm screenshot b1 --scale 0.5 -o - | display`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				out = args[0] + ".png"
			}
			png, err := client.FromEnv().Screenshot(cmd.Context(), args[0], scale)
			if err != nil {
				return err
			}
			if out == "-" {
				_, err = os.Stdout.Write(png)
				return err
			}
			if err := os.WriteFile(out, png, 0o644); err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, out)
			return nil
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write (default VM.png; - for stdout)")
	c.Flags().Float64Var(&scale, "scale", 1, "shrink by this factor, in (0, 1]")
	return c
}
