package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type runCodeIn struct {
	VM             string            `json:"vm,omitempty" jsonschema:"the VM's name or id (made with create_vm image code-interpreter)"`
	Code           string            `json:"code" jsonschema:"the code to run; the value of its last expression is returned"`
	Language       string            `json:"language,omitempty" jsonschema:"python (default), javascript, typescript, r, java or bash; each language has one default context whose state persists"`
	Context        string            `json:"context,omitempty" jsonschema:"run in this context id instead of the language's default one"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"interrupt the run after this many seconds (default 300); variables survive"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for this run only"`
}

func (t *tools) registerCode(s *sdk.Server) {
	add(t, s, false, &sdk.Tool{Name: "run_code", Description: "Run Python (default), JavaScript or bash in a live kernel of a code-interpreter VM (create it with create_vm and image \"code-interpreter\"). " +
		"Variables, imports and the working directory persist between calls, like a notebook. Returns stdout, stderr, the value of the last expression, " +
		"rich results (pandas tables as text, matplotlib charts as PNG images) and the error with its traceback if the code raised. numpy, pandas and matplotlib are installed.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(true), OpenWorldHint: boolp(true)}}, t.runCode)
}

func (t *tools) runCode(ctx context.Context, in runCodeIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Context != "" && in.Language != "" {
		return nil, fmt.Errorf("give language or context, not both: a context has its own language")
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = 300
	}
	if timeout < 0 || timeout > 24*3600 {
		return nil, fmt.Errorf("timeout_seconds must be between 1 and 86400, got %d", in.TimeoutSeconds)
	}
	// The tool keeps what it shows, not what the code printed: a loop
	// printing forever must not fill the daemon's memory.
	out := newBoundedRun()
	err = t.c.RunCodeEvents(ctx, id, api.RunCodeRequest{Code: in.Code, Language: in.Language, Context: in.Context, Env: in.Env,
		Timeout: api.Duration(time.Duration(timeout) * time.Second)}, out.add)
	if err != nil {
		return nil, toolError("run_code", err)
	}
	var b strings.Builder
	var images []sdk.Content
	for _, o := range []*boundedText{&out.stdout, &out.stderr} {
		if o.total == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", o.name, o.b.String())
		if !strings.HasSuffix(o.b.String(), "\n") {
			b.WriteString("\n")
		}
		if o.total > o.b.Len() {
			fmt.Fprintf(&b, "[... %s truncated: showing %d of %d bytes; print less, or write it to a file and page it with read_file.]\n", o.name, o.b.Len(), o.total)
		}
	}
	for _, r := range out.results {
		label := "result"
		if r.Main {
			label = "value"
		}
		for _, mime := range []string{"image/png", "image/jpeg"} {
			var s string
			if json.Unmarshal(r.Data[mime], &s) == nil && s != "" {
				if raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err == nil {
					images = append(images, &sdk.ImageContent{Data: raw, MIMEType: mime})
					fmt.Fprintf(&b, "--- %s: %s image (attached) ---\n", label, mime)
				}
			}
		}
		var txt string
		for _, mime := range []string{"text/plain", "text/markdown", "text/latex", "image/svg+xml", "text/html"} {
			if json.Unmarshal(r.Data[mime], &txt) == nil && txt != "" {
				shown, cut := truncate(txt, maxShown)
				fmt.Fprintf(&b, "--- %s (%s) ---\n%s\n", label, mime, shown)
				if cut {
					fmt.Fprintf(&b, "[... truncated: showing %d of %d bytes]\n", len(shown), len(txt))
				}
				break
			}
		}
		if txt == "" {
			if j, ok := r.Data["application/json"]; ok {
				shown, _ := truncate(string(j), maxShown)
				fmt.Fprintf(&b, "--- %s (application/json) ---\n%s\n", label, shown)
			}
		}
	}
	if out.dropped > 0 {
		fmt.Fprintf(&b, "[... %d more results not shown]\n", out.dropped)
	}
	if out.err != nil {
		tb := out.err.Traceback
		if tb == "" {
			tb = out.err.Name + ": " + out.err.Value
		}
		shown, _ := truncate(stripANSI(tb), maxShown)
		fmt.Fprintf(&b, "--- error: %s: %s ---\n%s\n", out.err.Name, out.err.Value, shown)
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	fmt.Fprintf(&b, "[execution %d]\n", out.count)
	r := &sdk.CallToolResult{Content: append([]sdk.Content{&sdk.TextContent{Text: b.String()}}, images...)}
	r.IsError = out.err != nil
	return r, nil
}

// Bounds of what run_code keeps of a run.
const (
	maxResults     = 8       // results shown (images included)
	maxResultBytes = 4 << 20 // one result's representations
)

// boundedText keeps the first maxShown bytes of a stream and counts the rest.
type boundedText struct {
	name  string
	b     strings.Builder
	total int
}

func (t *boundedText) add(s string) {
	t.total += len(s)
	if room := maxShown - t.b.Len(); room > 0 {
		shown, _ := truncate(s, room)
		t.b.WriteString(shown)
	}
}

// boundedRun collects a run's events within the bounds above.
type boundedRun struct {
	stdout, stderr boundedText
	results        []api.CodeEvent
	dropped        int
	err            *api.CodeEvent
	count          int
}

func newBoundedRun() *boundedRun {
	return &boundedRun{stdout: boundedText{name: "stdout"}, stderr: boundedText{name: "stderr"}}
}

func (r *boundedRun) add(e api.CodeEvent) {
	switch e.Type {
	case api.CodeStdout:
		r.stdout.add(e.Text)
	case api.CodeStderr:
		r.stderr.add(e.Text)
	case api.CodeResult:
		size := 0
		for _, v := range e.Data {
			size += len(v)
		}
		if len(r.results) >= maxResults || size > maxResultBytes {
			r.dropped++
			return
		}
		r.results = append(r.results, e)
	case api.CodeError:
		if len(e.Traceback) > maxShown*4 {
			e.Traceback = e.Traceback[len(e.Traceback)-maxShown*4:]
		}
		r.err = &e
	case api.CodeCount:
		r.count = e.ExecutionCount
	}
}

// stripANSI removes terminal color codes (Jupyter tracebacks carry them).
func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == ';') {
				j++
			}
			if j < len(s) {
				i = j
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
