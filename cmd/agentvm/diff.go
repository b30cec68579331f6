package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
)

func diffCmd() *cobra.Command {
	var o client.DiffOptions
	var patch, asJSON bool
	c := &cobra.Command{
		Use:   "diff VM",
		Short: "What changed on a VM's disk since its creation or a snapshot: files added, changed and removed, read from its disk layers",
		Long: "Reads the VM's disk from the host (nothing runs in the guest) and compares it with the disk the VM\n" +
			"was made from, or a snapshot's. A running or paused VM's disk is frozen at this instant first (what its\n" +
			"kernel has written). Caches are left out unless --no-default-ignores: " + strings.Join(api.DiffDefaultIgnore, ", ") + ".",
		Example: "  agentvm diff dev\n  agentvm diff dev -p                      # with unified diffs of text files\n" +
			"  agentvm diff dev --since before-upgrade --ignore /var/cache --ignore '*.log'",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Diffs = patch
			d, err := client.FromEnv().Diff(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(d)
			}
			printDiff(d, patch)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.Since, "since", "create", "compare with the disk at create, or at this snapshot (name or id)")
	f.StringArrayVar(&o.Ignore, "ignore", nil, "leave out paths matching this pattern: /abs/path, or a name or a/b run anywhere; * ? [] per component (repeatable)")
	f.BoolVar(&o.NoDefaultIgnores, "no-default-ignores", false, "compare the caches too")
	f.BoolVarP(&patch, "patch", "p", false, "print unified diffs of text files")
	f.IntVar(&o.MaxEntries, "max-entries", 0, "report at most this many entries (default 20000)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// visible shows the control characters of what the guest wrote (names,
// file contents) as escapes, tabs and newlines aside: a terminal must not
// run a file's escape sequences, nor a carriage return hide a line from
// the reviewer.
func visible(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return (r < 0x20 && r != '\t' && r != '\n') || r == 0x7f || (r >= 0x80 && r < 0xa0) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func printDiff(d *api.DiffResponse, patch bool) {
	fmt.Fprintf(os.Stderr, "%s since %s (%s): %d added, %d changed, %d removed; %d entries scanned in %d ms\n",
		d.VM, d.Since, d.Base, len(d.Added), len(d.Changed), len(d.Removed), d.Scanned, d.TookMs)
	line := func(mark string, e api.DiffEntry) {
		desc := ""
		switch {
		case e.Kind == "dir":
			desc = "/"
		case e.Kind == "symlink":
			desc = " -> " + e.Target
		case slices.Contains(e.What, "content"):
			desc = fmt.Sprintf("  %s -> %s", humanBytes(e.OldSize), humanBytes(e.Size))
		case e.Kind == "file":
			desc = "  " + humanBytes(e.Size)
		}
		if len(e.What) > 0 {
			desc += "  (" + strings.Join(e.What, ", ") + ")"
		}
		if e.Binary {
			desc += "  binary"
		}
		fmt.Printf("%s %s%s\n", mark, visible(e.Path), visible(desc))
		if patch && e.Diff != "" {
			fmt.Print(visible(e.Diff))
		} else if patch && e.DiffNote != "" {
			fmt.Printf("  (%s)\n", visible(e.DiffNote))
		}
	}
	for _, e := range d.Added {
		line("A", e)
	}
	for _, e := range d.Changed {
		line("M", e)
	}
	for _, e := range d.Removed {
		line("D", e)
	}
	if d.Truncated {
		fmt.Fprintln(os.Stderr, "(more entries differ: raise --max-entries)")
	}
}
