package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
)

func tokenCmd() *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Manage tokens: scoped ones (each opens exactly one VM) and admin tokens"}
	var (
		allow, keys []string
		req         api.CreateTokenRequest
		asJSON      bool
	)
	create := &cobra.Command{
		Use:   "create [VM]",
		Short: "Create a scoped token for one VM and print it (without a VM: --admin for an admin token, --e2b for an E2B admin API key)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				req.VM = args[0]
			} else if !req.E2B && !req.Admin {
				return fmt.Errorf("name the VM the token opens (or use --admin for an admin token, --e2b for an E2B admin API key)")
			}
			if req.E2B && !cmd.Flags().Changed("ttl") {
				req.TTL = ""
			}
			for _, a := range allow {
				for _, p := range strings.Split(a, ",") {
					if p = strings.TrimSpace(p); p != "" {
						req.Allow = append(req.Allow, p)
					}
				}
			}
			for _, k := range keys {
				b, err := os.ReadFile(k)
				if err != nil {
					return fmt.Errorf("--ssh-key: %w", err)
				}
				req.SSHKeys = append(req.SSHKeys, strings.TrimSpace(string(b)))
			}
			t, err := client.FromEnv().CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(t)
			}
			fmt.Println(t.Secret)
			if t.VMID == "" {
				kind := "admin token"
				if req.E2B {
					kind = "E2B admin API key"
				}
				fmt.Fprintf(os.Stderr, "%s %s (every node of a cluster), expires %s (revoke: agentvm token rm %s)\n", kind, t.ID, t.ExpiresAt.Local().Format(time.RFC3339), t.ID)
				return nil
			}
			fmt.Fprintf(os.Stderr, "token %s for VM %s allows %s, expires %s\n", t.ID, t.VMID, strings.Join(t.Allow, ","), t.ExpiresAt.Local().Format(time.RFC3339))
			return nil
		},
	}
	f := create.Flags()
	f.StringSliceVar(&allow, "allow", nil, "permissions: "+strings.Join(api.AllPerms, ",")+" (default all)")
	f.StringVar(&req.TTL, "ttl", "1h", "lifetime (e.g. 15m, 1h, 720h)")
	f.StringVar(&req.User, "user", "", "limit the token to this guest user (e.g. agent)")
	f.StringVar(&req.Name, "name", "", "a label for the token")
	f.StringArrayVar(&keys, "ssh-key", nil, "public key file that logs in to the SSH gateway with this token's scope (repeatable)")
	f.BoolVar(&asJSON, "json", false, "print the token as JSON")
	f.BoolVar(&req.E2B, "e2b", false, "make an E2B API key (e2b_<40 hex>): for one VM, or without a VM an admin key for the E2B-compatible API")
	f.BoolVar(&req.Admin, "admin", false, "make an admin token (no VM): the admin's whole access, valid on every node of a cluster, revocable")

	var vmFilter string
	var lsJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List live tokens",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := client.FromEnv().ListTokens(cmd.Context(), vmFilter)
			if err != nil {
				return err
			}
			if lsJSON {
				return printJSON(ts)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tVM\tALLOW\tUSER\tEXPIRES\tNAME")
			for _, t := range ts {
				u := t.User
				if u == "" {
					u = "*"
				}
				vm := t.VMID
				if vm == "" {
					vm = "(all)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, vm, strings.Join(t.Allow, ","), u, time.Until(t.ExpiresAt).Round(time.Second), t.Name)
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&vmFilter, "vm", "", "only the tokens of this VM")
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:     "rm TOKEN-ID...",
		Aliases: []string{"revoke"},
		Short:   "Revoke tokens",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := client.FromEnv().RevokeToken(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.AddCommand(create, ls, rm)
	return c
}

func sshCmd() *cobra.Command {
	var user string
	c := &cobra.Command{
		Use:   "ssh VM [-- SSH-ARGS... [COMMAND]]",
		Short: "Open an SSH session to a VM through the gateway with the system ssh client",
		Long: "Runs the system ssh client against agentvm's SSH gateway with a throwaway key that is registered\n" +
			"for a few minutes under an ssh-only token, a pinned known_hosts entry for the gateway's host key\n" +
			"and IdentitiesOnly, so nothing in ~/.ssh is used or changed. Arguments after -- go to ssh.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := client.FromEnv()
			ctx := cmd.Context()
			info, err := cl.SSHInfo(ctx)
			if err != nil {
				return err
			}
			if !info.Enabled {
				return errors.New("the server's SSH gateway is disabled (start it with --ssh-listen)")
			}
			sshBin, err := exec.LookPath("ssh")
			if err != nil {
				return errors.New("ssh not found: install the OpenSSH client (apt-get install openssh-client)")
			}
			host, port, err := gatewayHostPort(cl.BaseURL, info.Listen)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "agentvm-ssh-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			pub, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			blk, err := ssh.MarshalPrivateKey(priv, "agentvm ssh")
			if err != nil {
				return err
			}
			keyFile := filepath.Join(dir, "id_ed25519")
			if err := os.WriteFile(keyFile, pem.EncodeToMemory(blk), 0o600); err != nil {
				return err
			}
			sp, err := ssh.NewPublicKey(pub)
			if err != nil {
				return err
			}
			tok, err := cl.CreateToken(ctx, api.CreateTokenRequest{VM: args[0], Allow: []string{api.PermSSH}, TTL: "5m", User: user,
				Name: "agentvm ssh", SSHKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))}})
			if err != nil {
				return err
			}
			defer cl.RevokeToken(ctx, tok.ID)
			kh := filepath.Join(dir, "known_hosts")
			hostPat := host
			if port != "22" {
				hostPat = "[" + host + "]:" + port
			}
			if err := os.WriteFile(kh, []byte(hostPat+" "+info.HostKey+"\n"), 0o600); err != nil {
				return err
			}
			login := tok.VMID
			if user != "" {
				login += "+" + user
			}
			sshArgs := []string{"-i", keyFile, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
				"-o", "UserKnownHostsFile=" + kh, "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
				"-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no", "-o", "LogLevel=ERROR",
				"-p", port, login + "@" + host}
			sshArgs = append(sshArgs, args[1:]...)
			sc := exec.Command(sshBin, sshArgs...)
			sc.Stdin, sc.Stdout, sc.Stderr = os.Stdin, os.Stdout, os.Stderr
			err = sc.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return exitError{ee.ExitCode()}
			}
			return err
		},
	}
	c.Flags().StringVar(&user, "user", "", "guest user (root or agent; default root)")
	return c
}

// gatewayHostPort picks the address ssh should dial: the gateway's listen
// address, with an unspecified host replaced by the API's host.
func gatewayHostPort(baseURL, listen string) (string, string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", "", fmt.Errorf("bad ssh gateway address %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		u, err := url.Parse(baseURL)
		if err != nil {
			return "", "", err
		}
		host = u.Hostname()
	}
	return host, port, nil
}

func caCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ca",
		Short: "Print the server's local CA certificate (serve --tls auto), e.g. for NODE_EXTRA_CA_CERTS or SSL_CERT_FILE",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := client.FromEnv().CA(cmd.Context())
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(b)
			return err
		},
	}
}
