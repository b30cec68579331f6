package main

import (
	"fmt"
	"os"

	"github.com/agentvm/agentvm/internal/guest/agent"
)

// sftpServer runs the sftp-server subcommand: SFTP on stdin/stdout, relative
// paths resolved against $HOME. Extra arguments (OpenSSH sftp-server flags)
// are ignored.
func sftpServer() int {
	home := os.Getenv("HOME")
	if home == "" {
		if h, err := os.UserHomeDir(); err == nil {
			home = h
		}
	}
	if fi, err := os.Stat(home); home == "" || err != nil || !fi.IsDir() {
		home = "/"
	}
	if err := agent.ServeSFTP(os.Stdin, os.Stdout, home); err != nil {
		fmt.Fprintf(os.Stderr, "agentvm-guest sftp-server: %v\n", err)
		return 1
	}
	return 0
}
