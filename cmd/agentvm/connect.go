package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func connectCmd() *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "connect VM PORT",
		Short: "Pipe stdin/stdout to a TCP port inside the VM (e.g. ssh -o ProxyCommand='agentvm connect VM 22'), or forward a local port to it (--listen)",
		Long: `Pipe stdin/stdout to a TCP port inside the VM, or with --listen forward a local
port to it: every connection to the local port opens its own stream into the VM.
Services listening on the VM's loopback are reached too.

  agentvm connect box1 22                      # stdin/stdout (ssh ProxyCommand)
  agentvm connect b1 9222 --listen 9222        # Chromium's DevTools protocol of a browser VM
                                               # on 127.0.0.1:9222: connectOverCDP('http://127.0.0.1:9222')`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return err
			}
			c := client.FromEnv()
			if listen != "" {
				return forwardPort(cmd.Context(), c, args[0], port, listen)
			}
			conn, err := c.DialTCP(cmd.Context(), args[0], port)
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
	c.Flags().StringVar(&listen, "listen", "", "forward this local [ADDR:]PORT to the VM's port instead of piping stdin/stdout (ADDR defaults to 127.0.0.1)")
	return c
}

// forwardPort accepts on a local address and joins each connection to a new
// stream into the VM, until the command is interrupted. Anyone who can
// connect to the local address uses the VM's port with this CLI's token:
// keep it on loopback.
func forwardPort(ctx context.Context, c *client.Client, vm string, port int, listen string) error {
	if !strings.Contains(listen, ":") {
		listen = "127.0.0.1:" + listen
	}
	// Fail now, not at the first connection, when the VM or the token is wrong.
	probe, err := c.DialTCP(ctx, vm, port)
	if err != nil {
		return err
	}
	probe.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(os.Stderr, "forwarding %s to port %d of %s (Ctrl-C ends it)\n", ln.Addr(), port, vm)
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		local, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer local.Close()
			remote, err := c.DialTCP(ctx, vm, port)
			if err != nil {
				fmt.Fprintf(os.Stderr, "connect to port %d of %s: %v\n", port, vm, err)
				return
			}
			defer remote.Close()
			done := make(chan struct{})
			go func() {
				io.Copy(local, remote)
				if cw, ok := local.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
				close(done)
			}()
			io.Copy(remote, local)
			if cw, ok := remote.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			<-done
		}()
	}
}
