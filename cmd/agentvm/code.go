package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// fileTypes are the result representations run-code saves with --out, in
// the order they are numbered.
var fileTypes = []struct{ mime, ext string }{
	{"image/png", ".png"}, {"image/jpeg", ".jpg"}, {"image/svg+xml", ".svg"}, {"application/pdf", ".pdf"},
	{"text/html", ".html"},
}

func runCodeCmd() *cobra.Command {
	var req api.RunCodeRequest
	var env []string
	var out string
	var timeout time.Duration
	var asJSON bool
	c := &cobra.Command{
		Use:   "run-code VM CODE|-",
		Short: "Run code in a code-interpreter VM's live kernel (state persists between runs)",
		Long: `Run Python (default), JavaScript, TypeScript, R, Java or bash in a VM made with
--image code-interpreter.
Variables, imports and the working directory persist between runs of the same
context. Output streams as it comes; the value of the last expression is printed;
images and HTML results are saved into --out DIR. An exception exits 1.`,
		Example: `  agentvm create --image code-interpreter --name ci
  agentvm run-code ci 'x = 41'
  agentvm run-code ci 'x + 1'
  echo 'import matplotlib.pyplot as plt; plt.plot([1,2]); plt.show()' | agentvm run-code ci --out charts -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Code = args[1]
			if req.Code == "-" {
				b, err := io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
				if err != nil {
					return err
				}
				req.Code = string(b)
			}
			var err error
			if req.Env, err = parseKV(env, "env"); err != nil {
				return err
			}
			req.Timeout = api.Duration(timeout)
			saved := 0
			show := func(e api.CodeEvent) {
				if asJSON {
					json.NewEncoder(os.Stdout).Encode(e)
					return
				}
				switch e.Type {
				case api.CodeStdout:
					os.Stdout.WriteString(e.Text)
				case api.CodeStderr:
					os.Stderr.WriteString(e.Text)
				case api.CodeResult:
					saved += saveResult(e, out, saved)
				case api.CodeError:
					if e.Traceback != "" {
						fmt.Fprintln(os.Stderr, e.Traceback)
					} else {
						fmt.Fprintf(os.Stderr, "%s: %s\n", e.Name, e.Value)
					}
				}
			}
			ex, err := client.FromEnv().RunCode(cmd.Context(), args[0], req, show)
			if err != nil {
				return err
			}
			if ex.Error != nil {
				return exitError{1}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&req.Language, "language", "l", "", "python (default), javascript, typescript, r, java or bash: runs in that language's default context")
	f.StringVar(&req.Context, "context", "", "run in this context (see code-context); exclusive with --language")
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE for this run (repeatable)")
	f.DurationVar(&timeout, "timeout", 0, "interrupt the run after this long (the context survives); default 5m")
	f.StringVarP(&out, "out", "o", "", "save image, PDF and HTML results into this directory (result-1.png, ...)")
	f.BoolVar(&asJSON, "json", false, "print the raw events, one JSON object per line")
	return c
}

// saveResult prints a result's text and saves its files; it returns how many
// files it saved (to number the next ones).
func saveResult(e api.CodeEvent, dir string, n int) int {
	var text string
	json.Unmarshal(e.Data["text/plain"], &text)
	var files []string
	for _, ft := range fileTypes {
		mime, ext := ft.mime, ft.ext
		raw, ok := e.Data[mime]
		if !ok {
			continue
		}
		if dir == "" {
			files = append(files, mime)
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			continue
		}
		b := []byte(s)
		if strings.HasPrefix(mime, "image/") && mime != "image/svg+xml" || mime == "application/pdf" {
			dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
			if err != nil {
				fmt.Fprintf(os.Stderr, "result %s is not base64: %v\n", mime, err)
				continue
			}
			b = dec
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return len(files)
		}
		p := filepath.Join(dir, fmt.Sprintf("result-%d%s", n+len(files)+1, ext))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			continue
		}
		files = append(files, p)
		fmt.Fprintf(os.Stderr, "saved %s to %s\n", mime, p)
	}
	// Images stand for themselves; their text is only a placeholder like
	// "<Figure size 640x480 with 1 Axes>". Other display results (R's
	// values, with their HTML) print their text.
	image := false
	for _, ft := range fileTypes {
		_, ok := e.Data[ft.mime]
		image = image || ok && ft.mime != "text/html"
	}
	if text != "" && (e.Main || !image) {
		fmt.Println(text)
	}
	if dir == "" && len(files) > 0 {
		fmt.Fprintf(os.Stderr, "(%s result: --out DIR saves it)\n", strings.Join(files, ", "))
		return 0
	}
	return len(files)
}

func codeContextCmd() *cobra.Command {
	c := &cobra.Command{Use: "code-context", Short: "List, create, restart and remove the code contexts (kernels) of a code-interpreter VM"}
	var asJSON bool
	ls := &cobra.Command{
		Use: "ls VM", Short: "List the VM's code contexts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cs, err := client.FromEnv().ListCodeContexts(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tLANGUAGE\tUSER\tCWD")
			for _, x := range cs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.ID, x.Language, x.User, x.Cwd)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var req api.CreateCodeContextRequest
	create := &cobra.Command{
		Use: "create VM", Short: "Start a new context and print its id", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			x, err := client.FromEnv().CreateCodeContext(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Println(x.ID)
			return nil
		},
	}
	create.Flags().StringVarP(&req.Language, "language", "l", "", "python (default), javascript, typescript, r, java or bash")
	create.Flags().StringVar(&req.Cwd, "cwd", "", "working directory (default /home/user)")
	create.Flags().StringVar(&req.User, "user", "", `guest user the kernel runs as: "user" (default) or "root"`)
	restart := &cobra.Command{
		Use: "restart VM CONTEXT", Short: "Restart a context's kernel (its variables are lost)", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().RestartCodeContext(cmd.Context(), args[0], args[1])
		},
	}
	rm := &cobra.Command{
		Use: "rm VM CONTEXT", Short: "Stop and remove a context", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return client.FromEnv().DeleteCodeContext(cmd.Context(), args[0], args[1])
		},
	}
	c.AddCommand(ls, create, restart, rm)
	return c
}
