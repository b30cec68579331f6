package builder

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Spec is a template declared as data (agentvm.toml, or JSON through the
// API) rather than as a Dockerfile. It means what the Dockerfile it is
// turned into means (dockerfileOf), so both build the same way.
type Spec struct {
	From    string            `toml:"from" json:"from"`
	Env     map[string]string `toml:"env" json:"env,omitempty"`
	Workdir string            `toml:"workdir" json:"workdir,omitempty"`
	User    string            `toml:"user" json:"user,omitempty"`
	Steps   []SpecStep        `toml:"steps" json:"steps,omitempty"`
	Start   *SpecStart        `toml:"start" json:"start,omitempty"`
}

// SpecStep is one step: a command to run, or files to copy.
type SpecStep struct {
	Run   Command `toml:"run" json:"run,omitempty"`   // a shell line, or an argv
	User  string  `toml:"user" json:"user,omitempty"` // run as this user (default: the spec's)
	Copy  string  `toml:"copy" json:"copy,omitempty"` // a path or glob in the build context
	To    string  `toml:"to" json:"to,omitempty"`
	Owner string  `toml:"owner" json:"owner,omitempty"` // user[:group] (default root)
	Mode  string  `toml:"mode" json:"mode,omitempty"`   // octal, e.g. "755"
}

// SpecStart is the start command and how to know it is ready.
type SpecStart struct {
	Cmd   Command    `toml:"cmd" json:"cmd"`
	Ready *SpecReady `toml:"ready" json:"ready,omitempty"`
	Ports []int      `toml:"ports" json:"ports,omitempty"` // TCP ports it serves (EXPOSE)
}

// SpecReady is one ready check: a port that accepts connections, a URL
// that answers 2xx, a command that exits 0, or a fixed wait.
type SpecReady struct {
	Port    int    `toml:"port" json:"port,omitempty"`
	URL     string `toml:"url" json:"url,omitempty"`
	Cmd     string `toml:"cmd" json:"cmd,omitempty"`
	Timeout string `toml:"timeout" json:"timeout,omitempty"`
}

// Command is a shell line or an argv.
type Command []string

// UnmarshalJSON takes a string (a shell line) or an array (an argv).
func (c *Command) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = shellLine(s)
		return nil
	}
	var argv []string
	if err := json.Unmarshal(b, &argv); err != nil {
		return fmt.Errorf("a command is a string (run by /bin/sh -c) or an array of strings")
	}
	*c = argv
	return nil
}

// UnmarshalTOML takes a string or an array of strings.
func (c *Command) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case string:
		*c = shellLine(x)
		return nil
	case []any:
		argv := make([]string, len(x))
		for i, a := range x {
			s, ok := a.(string)
			if !ok {
				return fmt.Errorf("a command's argv holds strings only")
			}
			argv[i] = s
		}
		*c = argv
		return nil
	}
	return fmt.Errorf("a command is a string (run by /bin/sh -c) or an array of strings")
}

func shellLine(s string) Command {
	if s == "" {
		return nil
	}
	return Command{"/bin/sh", "-c", s}
}

// parseSpec reads a spec as JSON (a document starting with "{") or TOML.
func parseSpec(b []byte) (*Spec, error) {
	var sp Spec
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&sp); err != nil {
			return nil, fmt.Errorf("%w: spec (JSON): %v", ErrInvalid, err)
		}
		return &sp, nil
	}
	md, err := toml.Decode(string(b), &sp)
	if err != nil {
		return nil, fmt.Errorf("%w: spec (TOML): %v", ErrInvalid, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("%w: spec: unknown key %s", ErrInvalid, un[0])
	}
	return &sp, nil
}

// word quotes s for a Dockerfile word whose variables are not expanded.
func word(s string) string { return EscapeDollar(QuoteWord(s)) }

// QuoteWord quotes s as one Dockerfile word; its $VARIABLES still expand
// (EscapeDollar of the quoted word keeps them as written).
func QuoteWord(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// EscapeDollar keeps a word's $ from expanding in a Dockerfile.
func EscapeDollar(s string) string { return strings.ReplaceAll(s, "$", `\$`) }

// ExecForm writes argv as a Dockerfile exec form (not expanded, but for
// COPY's, which EscapeDollar guards).
func ExecForm(argv ...string) string {
	b, _ := json.Marshal(argv)
	return string(b)
}

// dockerfileOf turns a spec into the Dockerfile it means, and names the
// spec's part each line comes from (for messages).
func dockerfileOf(sp *Spec) ([]byte, []string, error) {
	var lines, from []string
	add := func(where, format string, a ...any) {
		lines, from = append(lines, fmt.Sprintf(format, a...)), append(from, where)
	}
	bad := func(where, format string, a ...any) error {
		return fmt.Errorf("%w: spec %s: %s", ErrInvalid, where, fmt.Sprintf(format, a...))
	}
	for _, s := range append([]string{sp.From, sp.Workdir, sp.User}, keysAndValues(sp.Env)...) {
		if strings.ContainsAny(s, "\n\r") {
			return nil, nil, bad("", "%q: a line break in a value", s)
		}
	}
	if sp.From == "" {
		return nil, nil, bad("from", "missing: an image (default, code-interpreter, browser) or a template")
	}
	add("from", "FROM %s", word(sp.From))
	for _, k := range sortedKeys(sp.Env) {
		if !envName(k) {
			return nil, nil, bad("env", "%q is not a variable name", k)
		}
		add("env."+k, "ENV %s=%s", k, word(sp.Env[k]))
	}
	if sp.Workdir != "" {
		add("workdir", "WORKDIR %s", word(sp.Workdir))
	}
	user := sp.User
	if user != "" {
		add("user", "USER %s", word(user))
	}
	for i, st := range sp.Steps {
		where := fmt.Sprintf("steps[%d]", i)
		switch {
		case len(st.Run) > 0 && st.Copy != "":
			return nil, nil, bad(where, "a step either runs or copies")
		case len(st.Run) > 0:
			if st.To != "" || st.Owner != "" || st.Mode != "" {
				return nil, nil, bad(where, "to, owner and mode go with copy")
			}
			if st.User != "" && !userName(st.User) {
				return nil, nil, bad(where, "user %q is not a user name", st.User)
			}
			if st.User != "" && st.User != user {
				add(where, "USER %s", word(st.User))
			}
			add(where, "RUN %s", ExecForm(st.Run...))
			if st.User != "" && st.User != user {
				add(where, "USER %s", word(orDefault(user, "root")))
			}
		case st.Copy != "":
			if st.To == "" {
				return nil, nil, bad(where, "copy needs to (the destination)")
			}
			if st.User != "" {
				return nil, nil, bad(where, "user goes with run (owner sets a copy's owner)")
			}
			flags := ""
			if st.Owner != "" {
				if !ownerSpec(st.Owner) {
					return nil, nil, bad(where, "owner %q: use USER, USER:GROUP or numeric ids", st.Owner)
				}
				flags += " --chown=" + st.Owner
			}
			if st.Mode != "" {
				if m, err := strconv.ParseUint(st.Mode, 8, 32); err != nil || m > 0o7777 {
					return nil, nil, bad(where, "mode %q: an octal mode such as 644 or 0755", st.Mode)
				}
				flags += " --chmod=" + st.Mode
			}
			add(where, "COPY%s %s", flags, ExecForm(EscapeDollar(st.Copy), EscapeDollar(st.To)))
		default:
			return nil, nil, bad(where, "a step needs run or copy")
		}
	}
	if sp.Start != nil {
		if len(sp.Start.Cmd) == 0 {
			return nil, nil, bad("start", "cmd is missing")
		}
		for _, p := range sp.Start.Ports {
			add("start.ports", "EXPOSE %d", p)
		}
		if r := sp.Start.Ready; r != nil {
			n := 0
			for _, set := range []bool{r.Port != 0, r.URL != "", r.Cmd != "", r.Timeout != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return nil, nil, bad("start.ready", "give one of port, url, cmd or timeout")
			}
			switch {
			case r.Port != 0:
				add("start.ready", "HEALTHCHECK CMD %s", ExecForm("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+strconv.Itoa(r.Port)))
			case r.URL != "":
				add("start.ready", "HEALTHCHECK CMD %s", ExecForm("curl", "-fsS", "--max-time", "5", "-o", "/dev/null", r.URL))
			case r.Cmd != "":
				add("start.ready", "HEALTHCHECK CMD %s", ExecForm("/bin/sh", "-c", r.Cmd))
			default:
				d, err := time.ParseDuration(r.Timeout)
				if err != nil || d <= 0 {
					return nil, nil, bad("start.ready", "timeout %q: a duration such as 5s", r.Timeout)
				}
				add("start.ready", "HEALTHCHECK CMD %s", ExecForm("sleep", strconv.FormatFloat(d.Seconds(), 'f', -1, 64)))
			}
		}
		add("start.cmd", "CMD %s", ExecForm(sp.Start.Cmd...))
	}
	return []byte(strings.Join(lines, "\n") + "\n"), from, nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func keysAndValues(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// specError names the spec's part a Dockerfile line came from.
func specError(err error, from []string) error {
	var le *LineError
	if errors.As(err, &le) && le.Line >= 1 && le.Line <= len(from) {
		return &LineError{Line: le.Line, Where: "spec " + from[le.Line-1], Msg: le.Msg}
	}
	return err
}
