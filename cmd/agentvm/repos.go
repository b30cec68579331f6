package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func repoCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "repo",
		Short: "Hosted git repositories: create, list, tokens, webhooks",
		Long: "Git repositories the daemon hosts, served over git's smart HTTP protocol at <server>/git/NAME.git\n" +
			"(the password is a token: the admin token or one from 'repo token'). A VM made with\n" +
			"'create --repo NAME' pushes and pulls at http://git.agentvm.internal/NAME.git with no credential.",
		Example: "  agentvm repo create app --from-dir .\n  agentvm create --name dev --repo app@main\n" +
			"  git clone http://x:$(agentvm repo token app)@127.0.0.1:7070/git/app.git\n" +
			"  agentvm repo token app --write --branches 'agent/*' --ttl 2h\n  agentvm repo hook add app https://ci.example.com/hook",
	}
	c.AddCommand(repoCreateCmd(), repoLsCmd(), repoRmCmd(), repoTokenCmd(), repoHookCmd(), repoLogCmd())
	return c
}

func repoCreateCmd() *cobra.Command {
	var fromURL, fromDir string
	var allowPrivate, asJSON bool
	c := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a repository: empty, a copy of a URL's, or your local repository pushed into it",
		Example: "  agentvm repo create app\n  agentvm repo create app --from-dir ~/src/app     # every branch and tag of a local repository\n" +
			"  agentvm repo create lib --from-url https://github.com/org/lib.git",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromURL != "" && fromDir != "" {
				return errors.New("give --from-url or --from-dir, not both")
			}
			if fromDir != "" {
				if err := exec.Command("git", "-C", fromDir, "rev-parse", "--git-dir").Run(); err != nil {
					return fmt.Errorf("--from-dir %s is not a git repository (git init and commit first)", fromDir)
				}
			}
			cl := client.FromEnv()
			r, err := cl.CreateRepo(cmd.Context(), api.CreateRepoRequest{Name: args[0], FromURL: fromURL, AllowPrivate: allowPrivate})
			if err != nil {
				return err
			}
			if fromDir != "" {
				if err := pushDir(cmd.Context(), cl, r.Name, fromDir); err != nil {
					return fmt.Errorf("repository %s was made, but the push of %s failed: %w", r.Name, fromDir, err)
				}
				if r, err = cl.GetRepo(cmd.Context(), r.Name); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(r)
			}
			fmt.Printf("%s: %s%s (%d branches)\n", r.Name, cl.BaseURL, r.URL, len(r.Branches))
			return nil
		},
	}
	c.Flags().StringVar(&fromURL, "from-url", "", "copy every branch and tag of the repository at this http(s) URL (fetched by the daemon)")
	c.Flags().StringVar(&fromDir, "from-dir", "", "push every branch and tag of this local git repository into it (with your git)")
	c.Flags().BoolVar(&allowPrivate, "allow-private", false, "let --from-url be on a loopback, private or link-local address")
	c.Flags().BoolVar(&asJSON, "json", false, "print the repository as JSON")
	return c
}

// pushDir pushes every branch and tag of the local repository dir with the
// local git, under a write token made for it and revoked after. The token
// goes to git in its environment (a config header), not on a command line.
func pushDir(ctx context.Context, cl *client.Client, name, dir string) error {
	t, err := cl.CreateRepoToken(ctx, name, api.CreateRepoTokenRequest{Access: api.RepoWrite, TTL: "1h", Name: "repo create --from-dir"})
	if err != nil {
		return err
	}
	defer cl.RevokeToken(context.WithoutCancel(ctx), t.ID)
	cmd := exec.CommandContext(ctx, "git", "-C", dir, "push", "--quiet", cl.BaseURL+"/git/"+name+".git",
		"refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*")
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_COUNT=1",
		"GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Bearer "+t.Secret)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

func repoLsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [NAME]",
		Short: "List repositories (or one, with its branches and webhooks)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := client.FromEnv()
			if len(args) == 1 {
				r, err := cl.GetRepo(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(r)
				}
				fmt.Printf("%s  %s%s  head %s  %s\n", r.Name, cl.BaseURL, r.URL, orDash(r.Head), humanBytes(r.SizeBytes))
				for b, sha := range r.Branches {
					fmt.Printf("  branch %s  %s\n", b, sha)
				}
				for _, h := range r.Hooks {
					fmt.Printf("  hook %s  %s\n", h.ID, h.URL)
				}
				return nil
			}
			list, err := cl.ListRepos(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBRANCHES\tHEAD\tSIZE\tHOOKS\tCREATED")
			for _, r := range list {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\n", r.Name, len(r.Branches), orDash(r.Head), humanBytes(r.SizeBytes), len(r.Hooks), r.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1fG", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fM", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

func repoRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete repositories, their tokens (clones and pushes under way end) and their VMs' access",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := client.FromEnv()
			for _, n := range args {
				if err := cl.DeleteRepo(cmd.Context(), n); err != nil {
					return err
				}
				fmt.Println(n)
			}
			return nil
		},
	}
}

func repoTokenCmd() *cobra.Command {
	var req api.CreateRepoTokenRequest
	var write, asJSON bool
	c := &cobra.Command{
		Use:   "token NAME",
		Short: "Print a token that opens one repository over git (read, or --write), revoked with 'agentvm token rm ID'",
		Example: "  git clone http://x:$(agentvm repo token app)@127.0.0.1:7070/git/app.git\n" +
			"  agentvm repo token app --write --branches 'agent/*' --ttl 8h --name ci",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if write {
				req.Access = api.RepoWrite
			}
			t, err := client.FromEnv().CreateRepoToken(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(t)
			}
			fmt.Println(t.Secret)
			fmt.Fprintf(os.Stderr, "token %s: %s on repository %s until %s\n", t.ID, strings.Join(t.Allow, "+"), t.Repo, t.ExpiresAt.Local().Format(time.DateTime))
			return nil
		},
	}
	c.Flags().BoolVar(&write, "write", false, "allow pushes (default: clone and fetch only)")
	c.Flags().StringVar(&req.Branches, "branches", "", "with --write: push only to branches matching this glob (agent/*; * matches / too)")
	c.Flags().StringVar(&req.TTL, "ttl", "1h", "lifetime (at most 8760h)")
	c.Flags().StringVar(&req.Name, "name", "", "a name to recognise the token by in 'token ls'")
	c.Flags().BoolVar(&asJSON, "json", false, "print the token as JSON")
	return c
}

func repoHookCmd() *cobra.Command {
	c := &cobra.Command{Use: "hook", Short: "Webhooks: a signed POST after each push"}
	var allowPrivate bool
	add := &cobra.Command{
		Use:   "add NAME URL",
		Short: "Add a webhook and print its secret (the key of the X-Agentvm-Signature HMAC)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := client.FromEnv().AddRepoHook(cmd.Context(), args[0], api.AddRepoHookRequest{URL: args[1], AllowPrivate: allowPrivate})
			if err != nil {
				return err
			}
			fmt.Printf("%s %s\n", h.ID, h.Secret)
			return nil
		},
	}
	add.Flags().BoolVar(&allowPrivate, "allow-private", false, "let the hook reach loopback, private and link-local addresses")
	rm := &cobra.Command{
		Use:   "rm NAME HOOK",
		Short: "Remove a webhook",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().RemoveRepoHook(cmd.Context(), args[0], args[1])
		},
	}
	c.AddCommand(add, rm)
	return c
}

func repoLogCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "log NAME",
		Short: "A repository's pushes (who, each ref's old and new commit) and webhook deliveries",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			evs, err := client.FromEnv().RepoEvents(cmd.Context(), args[0], 0)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(evs)
			}
			for _, e := range evs {
				fmt.Printf("%s  %-8s %-22s %s\n", e.Time.Local().Format(time.DateTime), e.Type, e.Actor, e.Message)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
