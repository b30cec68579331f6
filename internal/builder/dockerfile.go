package builder

import (
	"bytes"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// A step is one instruction of the plan that changes the machine (RUN,
// COPY, ADD), resolved: its variables expanded, its files chosen.
type step struct {
	line int
	text string // the instruction as written, for progress and errors

	// RUN
	argv []string
	env  map[string]string
	user string
	cwd  string

	// COPY and ADD
	copy *copySet

	key string // the cache key of the machine after this step
}

// plan is a Dockerfile resolved against a build context and build
// arguments: everything a build does, decided before a VM is made.
type plan struct {
	from     string
	image    string // the image the build's first VM is made from (from, or what an OCI image became)
	fromLine int
	steps    []*step
	text     []string // every instruction as written, FROM first

	env     map[string]string
	workdir string
	user    string
	shell   []string
	start   []string // the start command's argv ("" shell form made argv)
	ready   []string // a HEALTHCHECK's command, run until it succeeds
	expose  []int
	noReady bool // HEALTHCHECK NONE

	// ENTRYPOINT and CMD, combined into start as Docker combines them.
	entry, cmd []string
	entryShell bool
	cmdSet     bool // a CMD in this Dockerfile
	startLine  int
	startText  string
}

// varEnv is the environment variables are expanded from: ENV over ARG.
type varEnv struct{ args, env map[string]string }

func (e varEnv) Get(k string) (string, bool) {
	if v, ok := e.env[k]; ok {
		return v, true
	}
	v, ok := e.args[k]
	return v, ok
}

func (e varEnv) Keys() []string {
	var ks []string
	for k := range e.args {
		ks = append(ks, k)
	}
	for k := range e.env {
		if _, ok := e.args[k]; !ok {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks
}

// LineError is a Dockerfile instruction that cannot be built as written
// (an invalid argument): its line, and why.
type LineError struct {
	Line  int
	Where string // "Dockerfile line N", or the spec's part the line came from
	Msg   string // the instruction and why
}

func (e *LineError) Error() string { return ErrInvalid.Error() + ": " + e.Where + ": " + e.Msg }
func (e *LineError) Unwrap() error { return ErrInvalid }

func lineErr(n *parser.Node, format string, a ...any) error {
	return &LineError{Line: n.StartLine, Where: fmt.Sprintf("Dockerfile line %d", n.StartLine),
		Msg: strings.ToUpper(n.Value) + ": " + fmt.Sprintf(format, a...)}
}

// ValidUser reports whether s can be a USER; ValidOwner whether it can be
// a --chown (user, user:group, ids); ValidEnvName whether it can be an ENV
// name. (Other ways to make a Dockerfile check their values with them.)
func ValidUser(s string) bool    { return userName(s) }
func ValidOwner(s string) bool   { return ownerSpec(s) }
func ValidEnvName(s string) bool { return envName(s) }

// args returns an instruction's arguments, as the parser split them.
func args(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

// parseFlags splits "--name=value" flags, refusing those not allowed.
func parseFlags(n *parser.Node, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range n.Flags {
		name, val, ok := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if !strings.HasPrefix(f, "--") || !contains(allowed, name) {
			if len(allowed) == 0 {
				return nil, lineErr(n, "flag %s is not supported (this instruction takes none)", f)
			}
			return nil, lineErr(n, "flag %s is not supported (supported: --%s)", f, strings.Join(allowed, ", --"))
		}
		if !ok && name != "link" {
			return nil, lineErr(n, "flag --%s needs a value (--%s=...)", name, name)
		}
		out[name] = val
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// base is what a Dockerfile's FROM may name: one of the images, or a
// template whose start command, environment, workdir and user carry over.
type base struct {
	env     map[string]string
	workdir string
	user    string
	start   []string
	ready   []string
	expose  []int
	// an OCI image's own ENTRYPOINT and CMD, combined with the
	// Dockerfile's as Docker combines them (start is both)
	entry, cmd []string
	notStarted string // an OCI image's command that is not a service's (ociBase)
}

// parsePlan reads a Dockerfile and resolves it against the build context
// and arguments. baseOf looks up what FROM names.
func parsePlan(dockerfile []byte, bctx *buildContext, buildArgs map[string]string, baseOf func(name string) (*base, error)) (*plan, error) {
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, fmt.Errorf("%w: Dockerfile: %v", ErrInvalid, err)
	}
	lex := shell.NewLex(res.EscapeToken)
	p := &plan{env: map[string]string{}, shell: []string{"/bin/sh", "-c"}}
	args0 := map[string]string{} // ARGs before FROM: only FROM sees them
	argsNow := map[string]string{}
	used := map[string]bool{}
	expand := func(n *parser.Node, word string, vars map[string]string) (string, error) {
		out, _, err := lex.ProcessWord(word, varEnv{args: vars, env: p.env})
		if err != nil {
			return "", lineErr(n, "%v", err)
		}
		return out, nil
	}
	seenFrom := false
	for _, n := range res.AST.Children {
		cmd := strings.ToLower(n.Value)
		if len(n.Heredocs) > 0 {
			return nil, lineErr(n, "heredocs (<<EOF) are not supported; put the script in the build context and COPY it")
		}
		if !seenFrom && cmd != "from" && cmd != "arg" {
			return nil, lineErr(n, "the first instruction must be FROM (or ARG before it)")
		}
		if cmd != "from" && cmd != "arg" || seenFrom {
			p.text = append(p.text, strings.TrimSpace(n.Original))
		}
		a := args(n)
		switch cmd {
		case "arg":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			for _, kv := range a {
				name, def, hasDef := strings.Cut(kv, "=")
				if name == "" {
					return nil, lineErr(n, "an ARG needs a name")
				}
				vars := argsNow
				if !seenFrom {
					vars = args0
				}
				val, given := buildArgs[name]
				if !given && hasDef {
					if val, err = expand(n, def, vars); err != nil {
						return nil, err
					}
				}
				if given || hasDef {
					vars[name] = val
				}
				used[name] = true
			}
		case "from":
			if seenFrom {
				return nil, lineErr(n, "a second FROM: multi-stage builds are not supported")
			}
			fl, err := parseFlags(n, "platform")
			if err != nil {
				return nil, err
			}
			if v := fl["platform"]; v != "" && v != "linux/amd64" {
				return nil, lineErr(n, "--platform=%s: templates run on linux/amd64", v)
			}
			if len(a) != 1 {
				return nil, lineErr(n, "FROM takes one name (an image or a template; AS is not supported)")
			}
			name, err := expand(n, a[0], args0)
			if err != nil {
				return nil, err
			}
			b, err := baseOf(name)
			if err != nil {
				return nil, lineErr(n, "%v", err)
			}
			seenFrom, p.from, p.fromLine = true, name, n.StartLine
			p.text = append([]string{strings.TrimSpace(n.Original)}, p.text...)
			for k, v := range b.env {
				p.env[k] = v
			}
			p.workdir, p.user, p.start, p.ready, p.expose = b.workdir, b.user, b.start, b.ready, append([]int(nil), b.expose...)
			p.entry, p.cmd, p.image = b.entry, b.cmd, name
		case "env":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			if len(a)%3 != 0 || len(a) == 0 { // the parser gives name, value, separator
				return nil, lineErr(n, "ENV needs KEY=VALUE pairs")
			}
			for i := 0; i < len(a); i += 3 {
				v, err := expand(n, a[i+1], argsNow)
				if err != nil {
					return nil, err
				}
				if !envName(a[i]) {
					return nil, lineErr(n, "%q is not a variable name", a[i])
				}
				p.env[a[i]] = v
			}
		case "label", "maintainer":
			// metadata: kept in the template's steps, no effect on the machine
		case "workdir":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			if len(a) != 1 {
				return nil, lineErr(n, "WORKDIR takes one path")
			}
			d, err := expand(n, a[0], argsNow)
			if err != nil {
				return nil, err
			}
			if !path.IsAbs(d) {
				d = path.Join(orRoot(p.workdir), d)
			}
			p.workdir = path.Clean(d)
		case "user":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			if len(a) != 1 {
				return nil, lineErr(n, "USER takes one name")
			}
			u, err := expand(n, a[0], argsNow)
			if err != nil {
				return nil, err
			}
			if strings.Contains(u, ":") {
				return nil, lineErr(n, "USER %s: a group is not supported (name the user; its primary group applies)", u)
			}
			if !userName(u) {
				return nil, lineErr(n, "%q is not a user name", u)
			}
			p.user = u
		case "expose":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			for _, e := range a {
				e, err := expand(n, e, argsNow)
				if err != nil {
					return nil, err
				}
				num, proto, _ := strings.Cut(e, "/")
				port, err := strconv.Atoi(num)
				if err != nil || port < 1 || port > 65535 || (proto != "" && proto != "tcp" && proto != "udp") {
					return nil, lineErr(n, "%q is not a port (PORT or PORT/tcp; ranges are not supported)", e)
				}
				if proto != "udp" && !containsInt(p.expose, port) {
					p.expose = append(p.expose, port)
				}
			}
		case "shell":
			if !n.Attributes["json"] || len(a) == 0 {
				return nil, lineErr(n, `SHELL takes a JSON array, e.g. SHELL ["/bin/bash", "-c"]`)
			}
			p.shell = a
		case "run":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			if len(a) == 0 {
				return nil, lineErr(n, "RUN needs a command")
			}
			p.steps = append(p.steps, &step{line: n.StartLine, text: strings.TrimSpace(n.Original),
				argv: p.command(n, a), env: p.runEnv(argsNow), user: p.user, cwd: orRoot(p.workdir)})
		case "copy", "add":
			fl, err := parseFlags(n, "chown", "chmod", "link")
			if err != nil {
				return nil, err
			}
			if len(a) < 2 {
				return nil, lineErr(n, "%s needs a source and a destination", strings.ToUpper(cmd))
			}
			words := make([]string, len(a))
			for i, w := range a {
				if words[i], err = expand(n, w, argsNow); err != nil {
					return nil, err
				}
			}
			dest := words[len(words)-1]
			intoDir := strings.HasSuffix(dest, "/") || dest == "." || dest == ".."
			if !path.IsAbs(dest) {
				dest = path.Join(orRoot(p.workdir), dest)
			}
			dest = path.Clean(dest)
			if intoDir && dest != "/" {
				dest += "/"
			}
			cs, err := bctx.choose(words[:len(words)-1], dest, cmd == "add")
			if err != nil {
				return nil, lineErr(n, "%v", err)
			}
			if cs.owner, err = expandFlag(n, expand, fl["chown"], argsNow); err != nil {
				return nil, err
			}
			if cs.owner != "" && !ownerSpec(cs.owner) {
				return nil, lineErr(n, "--chown=%s: use USER, USER:GROUP or numeric ids", cs.owner)
			}
			if c := fl["chmod"]; c != "" {
				m, err := strconv.ParseUint(c, 8, 32)
				if err != nil || m > 0o7777 {
					return nil, lineErr(n, "--chmod=%s: an octal mode such as 644 or 0755", c)
				}
				cs.mode = uint32(m)
			}
			p.steps = append(p.steps, &step{line: n.StartLine, text: strings.TrimSpace(n.Original), copy: cs})
		case "cmd", "entrypoint":
			if _, err := parseFlags(n); err != nil {
				return nil, err
			}
			if len(a) == 0 && !n.Attributes["json"] { // [] clears it, as in Docker
				return nil, lineErr(n, "%s needs a command", strings.ToUpper(cmd))
			}
			if cmd == "entrypoint" {
				p.entry, p.entryShell = p.command(n, a), !n.Attributes["json"]
				if !p.cmdSet { // a base's CMD goes with its ENTRYPOINT; this Dockerfile's stays (as BuildKit)
					p.cmd = nil
				}
			} else {
				p.cmd, p.cmdSet = p.command(n, a), true
			}
			p.start = append(append([]string(nil), p.entry...), p.cmd...)
			if p.entryShell {
				p.start = p.entry
			}
			p.startLine, p.startText = n.StartLine, strings.TrimSpace(n.Original)
		case "healthcheck":
			fl, err := parseFlags(n, "interval", "timeout", "start-period", "start-interval", "retries")
			if err != nil {
				return nil, err
			}
			_ = fl // the build polls the check until its ready timeout
			if n.Next == nil {
				return nil, lineErr(n, "HEALTHCHECK needs CMD or NONE")
			}
			switch strings.ToUpper(n.Next.Value) {
			case "NONE":
				p.ready, p.noReady = nil, true
			case "CMD":
				var ca []string
				for x := n.Next.Next; x != nil; x = x.Next {
					ca = append(ca, x.Value)
				}
				if len(ca) == 0 {
					return nil, lineErr(n, "HEALTHCHECK CMD needs a command")
				}
				p.ready, p.noReady = ca, false // exec form as is; CMD-SHELL runs in /bin/sh, as Docker's does
				if !n.Attributes["json"] {
					p.ready = []string{"/bin/sh", "-c", strings.Join(ca, " ")}
				}
			default:
				return nil, lineErr(n, "HEALTHCHECK takes CMD or NONE, not %s", n.Next.Value)
			}
		case "volume":
			return nil, lineErr(n, "not supported: a VM's disk persists as a whole; drop the line (RUN mkdir -p makes the directory)")
		case "onbuild", "stopsignal":
			return nil, lineErr(n, "not supported in templates")
		default:
			return nil, lineErr(n, "unknown instruction")
		}
	}
	if !seenFrom {
		return nil, fmt.Errorf("%w: Dockerfile: no FROM", ErrInvalid)
	}
	for k := range buildArgs {
		if !used[k] {
			return nil, fmt.Errorf("%w: build argument %s is not declared by an ARG in the Dockerfile", ErrInvalid, k)
		}
	}
	return p, nil
}

func expandFlag(n *parser.Node, expand func(*parser.Node, string, map[string]string) (string, error), v string, vars map[string]string) (string, error) {
	if v == "" {
		return "", nil
	}
	return expand(n, v, vars)
}

// command is a RUN's, CMD's or ENTRYPOINT's argv: the JSON form as is, the
// shell form through SHELL.
func (p *plan) command(n *parser.Node, a []string) []string {
	return p.commandAttrs(n.Attributes["json"], a)
}

func (p *plan) commandAttrs(json bool, a []string) []string {
	if json {
		return append([]string(nil), a...)
	}
	return append(append([]string(nil), p.shell...), strings.Join(a, " "))
}

// runEnv is what a RUN sees: ENV, and ARG values not shadowed by ENV.
func (p *plan) runEnv(args map[string]string) map[string]string {
	out := make(map[string]string, len(args)+len(p.env))
	for k, v := range args {
		out[k] = v
	}
	for k, v := range p.env {
		out[k] = v
	}
	return out
}

func orRoot(d string) string {
	if d == "" {
		return "/"
	}
	return d
}

func containsInt(list []int, x int) bool {
	for _, v := range list {
		if v == x {
			return true
		}
	}
	return false
}

func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func userName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return s[0] != '-'
}

func ownerSpec(s string) bool {
	u, g, hasG := strings.Cut(s, ":")
	return userName(u) && (!hasG || userName(g))
}
