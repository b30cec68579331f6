package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/spf13/cobra"
)

func templateCmd() *cobra.Command {
	c := &cobra.Command{Use: "template", Short: "Templates built from a Dockerfile: a create restores the built machine, its start command already running"}
	c.AddCommand(templateBuildCmd(), templateLsCmd(), templateInspectCmd(), templateTagCmd(), templateRmCmd(), templatePruneCmd())
	return c
}

func templateBuildCmd() *cobra.Command {
	var (
		file, spec, memory, disk string
		args                     []string
		o                        client.BuildOptions
		asJSON, passStdin        bool
	)
	c := &cobra.Command{
		Use:   "build NAME[:TAG] [CONTEXT]",
		Short: "Build (or rebuild) a template from a Dockerfile; unchanged steps come from the cache",
		Long: `Build a template from a Dockerfile (default CONTEXT/Dockerfile) and the files of CONTEXT
(default ., less what its .dockerignore excludes). Each RUN and COPY runs in a real VM and its result
is cached; a rebuild reuses the steps before the first one that changed. The build ends by starting
CMD/ENTRYPOINT, waiting until it is ready (HEALTHCHECK, else the EXPOSEd ports) and snapshotting the
running machine: agentvm create --template NAME restores it with the start command already serving.

FROM names an image (default, code-interpreter, browser), another template, or an OCI image in a
registry (FROM python:3.12-slim, FROM registry.example.com/team/app:tag; Debian- and Ubuntu-based):
its files get agentvm's kernel, systemd and guest agent, and its ENV, WORKDIR, USER and EXPOSE
carry over, its ENTRYPOINT and CMD too (started when the image exposes a port or checks its health). NAME is the latest build; NAME:TAG (and each --tag) also names this build, and
stays on it when NAME is built again. A private registry's login: --registry-user, with the password in
$AGENTVM_REGISTRY_PASSWORD or on stdin (--registry-password-stdin).`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, a []string) error {
			dir := "."
			if len(a) == 2 {
				dir = a[1]
			}
			var err error
			if o.BuildArgs, err = parseKV(args, "build-arg"); err != nil {
				return err
			}
			o.Memory, o.Disk = memory, disk
			for _, p := range []struct{ flag, v string }{{"--memory", memory}, {"--disk", disk}} {
				if p.v != "" {
					if _, err := api.ParseSize(p.v); err != nil {
						return fmt.Errorf("%s: %w", p.flag, err)
					}
				}
			}
			if o.RegistryUser != "" {
				if o.RegistryPassword, err = registryPassword(passStdin); err != nil {
					return err
				}
			} else if passStdin {
				return errors.New("--registry-password-stdin goes with --registry-user")
			}
			if spec != "" && file != "" {
				return errors.New("-f and --spec do not go together: a build takes a Dockerfile or a spec")
			}
			pr, pw := io.Pipe()
			df, hidden, err := dockerfileIn(dir, file, spec)
			if err != nil {
				return err
			}
			if spec != "" {
				o.Spec = df
			} else {
				o.Dockerfile = df
			}
			go func() { pw.CloseWithError(tarContext(pw, dir, hidden, df)) }()
			start := time.Now()
			t, err := client.FromEnv().BuildTemplate(cmd.Context(), a[0], pr, o, func(ev api.BuildEvent) {
				switch {
				case ev.Instruction != "":
					mark := ""
					if ev.Cached {
						mark = "  CACHED"
					}
					fmt.Fprintf(os.Stderr, "[%d/%d] %s%s\n", ev.Step, ev.Of, ev.Instruction, mark)
				case ev.Log != "":
					fmt.Fprint(os.Stderr, "  "+ev.Log)
				}
			})
			pr.CloseWithError(errors.New("the build ended"))
			if err != nil {
				var be *client.BuildError
				if errors.As(err, &be) && be.Step > 0 {
					return fmt.Errorf("build failed: %s", be.Message)
				}
				return err
			}
			if asJSON {
				return printJSON(t)
			}
			fmt.Printf("template %s built in %.1fs (snapshot %s)\n", t.Name, time.Since(start).Seconds(), t.Snapshot)
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	f.StringVar(&spec, "spec", "", "build from a spec (agentvm.toml, or JSON) instead of a Dockerfile; see docs/templates.md")
	f.StringArrayVar(&args, "build-arg", nil, "set an ARG: NAME=VALUE (repeatable)")
	f.BoolVar(&o.NoCache, "no-cache", false, "run every step again")
	f.IntVar(&o.CPUs, "cpus", 0, "the build machine's and the template's vCPUs (default 1; a template on a template keeps its base's)")
	f.StringVar(&memory, "memory", "", "its memory (MiB, or with K/M/G suffix; default 1024)")
	f.StringVar(&disk, "disk", "", "its disk (default 8G)")
	f.DurationVar(&o.ReadyTimeout, "ready-timeout", 0, "how long the start command may take to be ready (default 5m)")
	f.DurationVar(&o.Timeout, "timeout", 0, "the whole build's time limit (default 2h)")
	f.BoolVar(&asJSON, "json", false, "print the template as JSON")
	f.StringVar(&o.RegistryUser, "registry-user", "", "log in to the registry of an OCI base as this user (password: $AGENTVM_REGISTRY_PASSWORD or --registry-password-stdin)")
	f.BoolVar(&passStdin, "registry-password-stdin", false, "read the registry password from stdin")
	f.StringArrayVar(&o.Tags, "tag", nil, "also tag the build NAME:TAG (repeatable)")
	return c
}

// registryPassword reads the registry password from stdin or the
// environment.
func registryPassword(stdin bool) (string, error) {
	if !stdin {
		p := os.Getenv("AGENTVM_REGISTRY_PASSWORD")
		if p == "" {
			return "", errors.New("--registry-user needs a password: set AGENTVM_REGISTRY_PASSWORD or pass --registry-password-stdin")
		}
		return p, nil
	}
	b, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
	if err != nil {
		return "", fmt.Errorf("reading the registry password: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", errors.New("--registry-password-stdin: stdin was empty")
	}
	return p, nil
}

// dockerfileIn returns the Dockerfile's (or spec's) path in the context
// tar, and its path on disk when it lies outside the context (sent under a
// hidden name).
func dockerfileIn(dir, file, spec string) (string, string, error) {
	what := "the Dockerfile"
	if spec != "" {
		file, what = spec, "the spec"
	}
	if file == "" {
		file = filepath.Join(dir, "Dockerfile")
	}
	st, err := os.Stat(file)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", what, err)
	}
	if !st.Mode().IsRegular() {
		return "", "", fmt.Errorf("%s %s is not a file", what, file)
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	absFile, err := filepath.Abs(file)
	if err != nil {
		return "", "", err
	}
	if rel, err := filepath.Rel(absDir, absFile); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.ToSlash(rel), "", nil
	}
	return api.HiddenDockerfile, absFile, nil
}

// tarContext writes dir as a tar, less what its .dockerignore excludes
// (.dockerignore and keep, the Dockerfile or spec, are always sent);
// hidden, when set, is a Dockerfile from outside dir, sent as
// api.HiddenDockerfile.
func tarContext(w io.Writer, dir, hidden, keep string) error {
	var skip func(rel string, isDir bool) (bool, bool)
	var matchErr error // a pattern that fails leaves files out, and the build
	if f, err := os.Open(filepath.Join(dir, ".dockerignore")); err == nil {
		patterns, err := ignorefile.ReadAll(f)
		f.Close()
		if err != nil {
			return fmt.Errorf(".dockerignore: %w", err)
		}
		pm, err := patternmatcher.New(patterns)
		if err != nil {
			return fmt.Errorf(".dockerignore: %w", err)
		}
		skip = func(rel string, isDir bool) (bool, bool) {
			if rel == ".dockerignore" || rel == keep {
				return false, false
			}
			leave, err := pm.MatchesOrParentMatches(rel)
			if err != nil && matchErr == nil {
				matchErr = fmt.Errorf(".dockerignore: %s: %w", rel, err)
			}
			// An excluded directory is walked when a pattern may take
			// something in it back, or it holds the Dockerfile.
			return leave || err != nil, pm.Exclusions() || strings.HasPrefix(keep, rel+"/")
		}
	}
	var more func(*tar.Writer) error
	if hidden != "" {
		more = func(tw *tar.Writer) error {
			b, err := os.ReadFile(hidden)
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Name: api.HiddenDockerfile, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
	}
	if err := writeTar(w, dir, skip, more); err != nil {
		return err
	}
	return matchErr
}

func templateLsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := client.FromEnv().ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ts)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBASE\tSTEPS\tSTART\tCPUS\tMEMORY\tSTATE\tBUILT")
			for _, t := range ts {
				start := strings.Join(t.Start, " ")
				if len(start) > 40 {
					start = start[:37] + "..."
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%dM\t%dM\t%s ago\n", t.Name, t.Base, len(t.Steps), start, t.CPUs, t.MemoryMiB,
					t.StateBytes>>20, time.Since(t.BuiltAt).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func templateInspectCmd() *cobra.Command {
	var log bool
	c := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a template as JSON, with its Dockerfile and last build's log (--log: the log alone)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			t, err := client.FromEnv().GetTemplate(cmd.Context(), a[0])
			if err != nil {
				return err
			}
			if log {
				fmt.Print(t.BuildLog)
				return nil
			}
			return printJSON(t)
		},
	}
	c.Flags().BoolVar(&log, "log", false, "print the last build's log")
	return c
}

func templateRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME[:TAG]...",
		Short: "Remove templates (NAME:TAG: that tag only) and the cached steps nothing else uses (VMs made from them keep running)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, a []string) error {
			var errs []error
			for _, n := range a {
				if err := client.FromEnv().DeleteTemplate(cmd.Context(), n); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", n, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}

func templateTagCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "tag NAME[:TAG] TAG...",
		Short: "Tag a template's build: NAME:TAG then restores it, whatever NAME is built as later",
		Long: `Tag a template's build (NAME, its latest, or NAME:TAG): each TAG then names it as NAME:TAG,
for agentvm create --template NAME:TAG and FROM NAME:TAG. A tag on another build of NAME moves to
this one; the tag latest makes this build NAME's latest.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, a []string) error {
			t, err := client.FromEnv().TagTemplate(cmd.Context(), a[0], a[1:]...)
			if err != nil {
				return err
			}
			name, _, _ := strings.Cut(t.Name, ":")
			for _, tag := range a[1:] {
				fmt.Printf("%s:%s\n", name, tag)
			}
			return nil
		},
	}
}

func templatePruneCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "prune",
		Short: "Remove cached build steps no template uses (left by failed or superseded builds)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := client.FromEnv().PruneTemplates(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Printf("removed %d cached steps\n", n)
			return nil
		},
	}
}
