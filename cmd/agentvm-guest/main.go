// Command agentvm-guest is the guest agent: it runs as root under systemd
// inside the VM and serves the host over the virtio-serial port
// /dev/virtio-ports/agentvm.0 (see package internal/guest).
//
// "agentvm-guest sftp-server" serves SFTP on stdin/stdout instead, with the
// credentials it was started with (the host runs it through the agent's
// exec API as the session's user); it exits when the client disconnects.
//
// Build it static: CGO_ENABLED=0 go build ./cmd/agentvm-guest
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/guest/agent"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sftp-server" {
		os.Exit(sftpServer())
	}
	device := flag.String("device", guest.DevicePath, "virtio-serial port of the agent channel")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Printf("agentvm-guest %s (protocol %d)\n", guest.Version, guest.ProtoVersion)
		return
	}
	log.SetFlags(0) // journald timestamps lines
	log.SetPrefix("agentvm-guest: ")

	a, err := agent.New(agent.Options{DevicePath: *device})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log.Printf("version %s, protocol %d, port %s", guest.Version, guest.ProtoVersion, *device)
	if err := a.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
