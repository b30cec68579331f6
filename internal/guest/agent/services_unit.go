package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

// Escaping for unit files (systemd.syntax(7)). Values are written as one
// double-quoted word: inside it \ and " are escaped with a backslash and a
// tab as \t (ExecStart= and Environment= unquote and C-unescape each word),
// % is doubled (specifiers are expanded after unquoting), and in command
// lines $ is doubled (ExecStart= substitutes $VAR and ${VAR} at exec time;
// $$ is a literal $). Environment= does no $ substitution. Other control
// characters (newlines included) and invalid UTF-8 are refused.

func unitQuote(s string, dollar bool) (string, error) {
	if err := unitCheck(s); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\t':
			b.WriteString(`\t`)
		case '%':
			b.WriteString("%%")
		case '$':
			if dollar {
				b.WriteString("$$")
			} else {
				b.WriteByte('$')
			}
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}

// unitCheck refuses what cannot be written in a unit file value.
func unitCheck(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%q is not valid UTF-8", s)
	}
	for _, r := range s {
		if (r < 0x20 && r != '\t') || r == 0x7f {
			if r == '\n' {
				return fmt.Errorf("%q contains a newline", s)
			}
			return fmt.Errorf("%q contains a control character", s)
		}
	}
	return nil
}

// unitPlain escapes a value that is not unquoted by systemd (paths, names):
// only specifiers; no control characters, no surrounding white space.
func unitPlain(s string) (string, error) {
	if err := unitCheck(s); err != nil {
		return "", err
	}
	if strings.ContainsRune(s, '\t') || strings.TrimSpace(s) != s {
		return "", fmt.Errorf("%q has leading or trailing white space or a tab", s)
	}
	return strings.ReplaceAll(s, "%", "%%"), nil
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// svcSpec is a validated service request.
type svcSpec struct {
	name    string
	argv    []string // as requested (the /bin/sh -c form for a shell)
	path    string   // resolved executable
	user    *userInfo
	group   string // the primary gid, "" when /etc/group lacks it
	dir     string
	env     []string // sorted K=V
	restart string
	typ     string
}

func (m *svcManager) validate(req *api.ServiceCreate) (*svcSpec, error) {
	if !svcNameRE.MatchString(req.Name) {
		return nil, fmt.Errorf("invalid service name %q (want [a-z0-9][a-z0-9_.-]{0,62})", req.Name)
	}
	if req.Name == "guest" || strings.HasPrefix(req.Name, "job-") {
		return nil, fmt.Errorf("service name %q is reserved", req.Name)
	}
	sp := &svcSpec{name: req.Name, restart: req.Restart, typ: req.Type}
	if sp.restart == "" {
		sp.restart = "on-failure"
	}
	if sp.typ == "" {
		sp.typ = "simple"
	}
	switch sp.restart {
	case "no", "on-failure", "always":
	default:
		return nil, fmt.Errorf("invalid restart %q (want no, on-failure or always)", req.Restart)
	}
	switch sp.typ {
	case "simple", "oneshot":
	default:
		return nil, fmt.Errorf("invalid type %q (want simple or oneshot)", req.Type)
	}
	if sp.typ == "oneshot" && sp.restart == "always" {
		return nil, errors.New("restart=always is not allowed for a oneshot service")
	}
	ex, err := m.a.prepareExec(&guest.ExecRequest{Argv: req.Argv, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		return nil, err
	}
	if ex.lookErr != nil {
		return nil, ex.lookErr
	}
	if sp.user, err = m.a.users.lookup(req.User); err != nil {
		return nil, err
	}
	sp.group = m.a.primaryGroup(sp.user)
	sp.argv, sp.path, sp.dir = ex.argv, ex.path, ex.dir
	if !filepath.IsAbs(sp.path) {
		return nil, fmt.Errorf("command %q does not resolve to an absolute path", sp.argv[0])
	}
	if strings.ContainsAny(sp.path, "\"'\\") {
		return nil, fmt.Errorf("executable path %q contains a quote or a backslash (systemd refuses it)", sp.path)
	}
	// systemd sets these from User= (to the same values unless overridden).
	implied := map[string]string{"HOME": sp.user.Home, "USER": sp.user.Name, "LOGNAME": sp.user.Name, "SHELL": sp.user.Shell}
	for _, kv := range ex.env {
		k, v, _ := strings.Cut(kv, "=")
		if iv, ok := implied[k]; ok && iv == v {
			continue
		}
		if !envNameRE.MatchString(k) {
			return nil, fmt.Errorf("invalid env name %q (want [A-Za-z_][A-Za-z0-9_]*)", k)
		}
		sp.env = append(sp.env, kv)
	}
	sort.Strings(sp.env)
	return sp, nil
}

// unitFile renders the unit for sp.
func (sp *svcSpec) unitFile() (string, error) {
	var b strings.Builder
	fail := func(what string, err error) (string, error) {
		return "", fmt.Errorf("%s: %v", what, err)
	}
	b.WriteString("# Created by the agentvm guest agent (" + guest.PathServices + ").\n")
	b.WriteString("[Unit]\nDescription=agentvm service " + sp.name + "\nAfter=network.target\n\n[Service]\n")
	b.WriteString("Type=" + sp.typ + "\nExecStart=")
	for i, arg := range sp.argv {
		if i == 0 {
			arg = sp.path
		}
		q, err := unitQuote(arg, i > 0)
		if err != nil {
			return fail(fmt.Sprintf("argv[%d]", i), err)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(q)
	}
	b.WriteByte('\n')
	user, err := unitPlain(sp.user.Name)
	if err != nil {
		return fail("user", err)
	}
	dir, err := unitPlain(sp.dir)
	if err != nil {
		return fail("cwd", err)
	}
	b.WriteString("User=" + user + "\n")
	if sp.group != "" {
		b.WriteString("Group=" + sp.group + "\n")
	}
	b.WriteString("WorkingDirectory=" + dir + "\n")
	for _, kv := range sp.env {
		q, err := unitQuote(kv, false)
		if err != nil {
			k, _, _ := strings.Cut(kv, "=")
			return fail("env "+k, err)
		}
		b.WriteString("Environment=" + q + "\n")
	}
	b.WriteString("Restart=" + sp.restart + "\nRestartSec=1\n")
	if sp.typ == "oneshot" {
		b.WriteString("RemainAfterExit=no\n")
	}
	b.WriteString("StandardOutput=journal\n\n[Install]\nWantedBy=multi-user.target\n")
	return b.String(), nil
}

// primaryGroup returns u's primary gid for Group= (systemd-run --gid=), or
// "" when /etc/group has no such group: systemd fails a numeric Group= it
// cannot resolve (216/GROUP), while without Group= it uses the passwd gid,
// which is the same group.
func (a *Agent) primaryGroup(u *userInfo) string {
	gid := strconv.FormatUint(uint64(u.GID), 10)
	b, err := os.ReadFile(a.path("/etc/group"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 3 && f[2] == gid && !strings.HasPrefix(f[0], "#") {
			return gid
		}
	}
	return ""
}
