package main

import (
	"io"
	"os"
	"strconv"

	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func connectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "connect VM PORT",
		Short: "Pipe stdin/stdout to a TCP port inside the VM (e.g. ssh -o ProxyCommand='agentvm connect VM 22')",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return err
			}
			conn, err := client.FromEnv().DialTCP(cmd.Context(), args[0], port)
			if err != nil {
				return err
			}
			defer conn.Close()
			done := make(chan struct{})
			go func() { io.Copy(os.Stdout, conn); close(done) }()
			io.Copy(conn, os.Stdin)
			if cw, ok := conn.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite() // the service sees EOF, and may still answer
			}
			<-done
			return nil
		},
	}
}
