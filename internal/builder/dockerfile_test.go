package builder

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// tarOf makes a build context: name → content ("/" suffix: a directory,
// "->" prefix: a symlink).
func tarOf(t *testing.T, files map[string]string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		h := &tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(body))}
		switch {
		case strings.HasSuffix(name, "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(body, "->"):
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, body[2:], 0
		case strings.HasSuffix(name, ".sh"):
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	return &buf
}

func ctxOf(t *testing.T, files map[string]string) *buildContext {
	t.Helper()
	c, err := unpackContext(tarOf(t, files), t.TempDir()+"/ctx")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func images(name string) (*base, error) {
	if name == "default" {
		return &base{}, nil
	}
	if name == "web" {
		return &base{env: map[string]string{"FROM_BASE": "1"}, workdir: "/srv", user: "user", start: []string{"/srv/run"}, expose: []int{80}}, nil
	}
	if name == "nginx:1" { // an OCI image's, its ENTRYPOINT and CMD apart
		return &base{entry: []string{"/docker-entrypoint.sh"}, cmd: []string{"nginx", "-g", "daemon off;"},
			start: []string{"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"}, expose: []int{80}}, nil
	}
	return nil, fmt.Errorf("%s is neither an image nor a template", name)
}

func TestPlanEveryInstruction(t *testing.T) {
	c := ctxOf(t, map[string]string{"app/main.py": "print(1)", "app/lib/x.py": "x", "run.sh": "#!/bin/sh", "notes.txt": "n"})
	df := `# a comment
ARG BASE=default
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/opt/app PORT=8000
LABEL team=agents
WORKDIR $APP_HOME
COPY --chown=user:user --chmod=640 app/ ./
ADD run.sh /usr/local/bin/
COPY *.txt /etc/notes/
USER user
RUN echo "$GREETING $PORT" > greeting
RUN ["/bin/echo", "exec form"]
SHELL ["/bin/bash", "-c"]
RUN echo bash
EXPOSE 8000/tcp 53/udp
HEALTHCHECK --interval=5s CMD curl -f http://127.0.0.1:8000/
CMD python3 -m http.server $PORT
`
	p, err := parsePlan([]byte(df), c, map[string]string{"GREETING": "hi"}, images)
	if err != nil {
		t.Fatal(err)
	}
	if p.from != "default" || p.workdir != "/opt/app" || p.user != "user" || !reflect.DeepEqual(p.expose, []int{8000}) {
		t.Fatalf("plan: from %q workdir %q user %q expose %v", p.from, p.workdir, p.user, p.expose)
	}
	if want := map[string]string{"APP_HOME": "/opt/app", "PORT": "8000"}; !reflect.DeepEqual(p.env, want) {
		t.Fatalf("env %v", p.env)
	}
	if want := []string{"/bin/bash", "-c", "python3 -m http.server $PORT"}; !reflect.DeepEqual(p.start, want) {
		t.Fatalf("start %q", p.start)
	}
	if want := []string{"/bin/sh", "-c", "curl -f http://127.0.0.1:8000/"}; !reflect.DeepEqual(p.ready, want) {
		t.Fatalf("ready %q", p.ready)
	}
	if len(p.steps) != 6 {
		t.Fatalf("%d steps, want 6", len(p.steps))
	}
	cp := p.steps[0].copy
	if cp.destDir != "/opt/app" || cp.owner != "user:user" || cp.mode != 0o640 {
		t.Fatalf("COPY app/ ./: %+v", cp)
	}
	var names []string
	for _, it := range cp.items {
		names = append(names, it.name)
	}
	if want := []string{"lib", "lib/x.py", "main.py"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("COPY app/ ./ copies %q, want %q", names, want)
	}
	if add := p.steps[1].copy; add.destDir != "/usr/local/bin" || add.items[0].name != "run.sh" {
		t.Fatalf("ADD: %+v", add)
	}
	if g := p.steps[2].copy; g.destDir != "/etc/notes" || len(g.items) != 1 || g.items[0].name != "notes.txt" {
		t.Fatalf("COPY *.txt: %+v", g)
	}
	run := p.steps[3]
	if run.user != "user" || run.cwd != "/opt/app" || run.env["GREETING"] != "hi" || run.argv[0] != "/bin/sh" {
		t.Fatalf("RUN: %+v", run)
	}
	if !reflect.DeepEqual(p.steps[4].argv, []string{"/bin/echo", "exec form"}) || p.steps[5].argv[0] != "/bin/bash" {
		t.Fatalf("RUN forms: %q %q", p.steps[4].argv, p.steps[5].argv)
	}
	if p.text[0] != "FROM ${BASE}" || len(p.text) != 16 {
		t.Fatalf("text: %d lines, first %q", len(p.text), p.text[0])
	}
}

func TestPlanFromATemplateInherits(t *testing.T) {
	p, err := parsePlan([]byte("FROM web\nRUN true\n"), ctxOf(t, nil), nil, images)
	if err != nil {
		t.Fatal(err)
	}
	if p.workdir != "/srv" || p.user != "user" || p.env["FROM_BASE"] != "1" || p.start[0] != "/srv/run" || p.steps[0].cwd != "/srv" {
		t.Fatalf("%+v", p)
	}
}

func TestPlanRefusals(t *testing.T) {
	c := ctxOf(t, map[string]string{"a.txt": "a", "pkg.tar.gz": "x"})
	for _, tc := range []struct{ df, want string }{
		{"FROM default\nVOLUME /data\n", "line 2: VOLUME: not supported"},
		{"FROM default\nFROBNICATE x\n", "line 2: FROBNICATE: unknown instruction"},
		{"FROM python:3.12-slim\n", "line 1: FROM: python:3.12-slim is neither an image nor a template"},
		{"FROM default\nFROM default\n", "line 2: FROM: a second FROM"},
		{"RUN true\n", "line 1: RUN: the first instruction must be FROM"},
		{"FROM default\nCOPY missing.txt /x\n", "line 2: COPY: missing.txt: no such file or directory in the build context"},
		{"FROM default\nADD https://example.com/x /x\n", "line 2: ADD: https://example.com/x: remote sources are not supported"},
		{"FROM default\nADD pkg.tar.gz /x/\n", "ADD of a local archive"},
		{"FROM default\nRUN --mount=type=cache,target=/x true\n", "line 2: RUN: flag --mount=type=cache,target=/x is not supported"},
		{"FROM default\nCOPY --from=builder /a /b\n", "line 2: COPY: flag --from=builder is not supported"},
		{"FROM default\nEXPOSE 80-90\n", `line 2: EXPOSE: "80-90" is not a port`},
		{"FROM default\nUSER user:staff\n", "line 2: USER: USER user:staff: a group is not supported"},
		{"FROM default\nRUN <<EOF\necho hi\nEOF\n", "line 2: RUN: heredocs"},
		{"FROM default\nCOPY --chmod=999 a.txt /a\n", "--chmod=999"},
		{"", "no instructions"},
		{"# only a comment\nARG X=1\n", "no FROM"},
	} {
		_, err := parsePlan([]byte(tc.df), c, nil, images)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an invalid-argument error with %q", tc.df, err, tc.want)
		}
	}
	if _, err := parsePlan([]byte("FROM default\n"), c, map[string]string{"NOPE": "1"}, images); err == nil || !strings.Contains(err.Error(), "NOPE is not declared") {
		t.Errorf("an undeclared build argument: %v", err)
	}
}

// orderedTar makes a tar of entries in the order given.
func orderedTar(t *testing.T, hdrs ...*tar.Header) io.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return &buf
}

// A symlink out of the context, then a directory and a file of its name:
// nothing is written outside.
func TestContextNeverWritesThroughASymlink(t *testing.T) {
	outside := t.TempDir()
	for name, hdrs := range map[string][]*tar.Header{
		"directory entry over the link": {
			{Name: "a", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "a/pwned", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		},
		"file under the link": {
			{Name: "a", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "a/pwned", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		},
		"relative link out": {
			{Name: "b", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../.." + outside},
			{Name: "b/", Typeflag: tar.TypeDir, Mode: 0o755},
		},
	} {
		if c, err := unpackContext(orderedTar(t, hdrs...), t.TempDir()+"/ctx"); err == nil {
			c.root.Close()
			t.Errorf("%s: unpacked", name)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("%s: wrote %s outside the context", name, ents[0].Name())
		}
	}
}

func TestContextRefusesEscapes(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"dot-dot":         {"../evil": "x"},
		"through symlink": {"link": "->/etc", "link/passwd": "x"},
	} {
		_, err := unpackContext(tarOf(t, files), t.TempDir()+"/ctx")
		if err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want a refusal", name, err)
		}
	}
}

func TestCopyDigestFollowsContentNotTime(t *testing.T) {
	d := func(body string) string {
		c := ctxOf(t, map[string]string{"f": body})
		cs, err := c.choose([]string{"f"}, "/x", false)
		if err != nil {
			t.Fatal(err)
		}
		s, err := cs.digest(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if d("a") != d("a") || d("a") == d("b") {
		t.Fatal("the digest of a COPY must depend on the content alone")
	}
}

func TestPlanStartCombinesEntrypointAndCmd(t *testing.T) {
	for df, want := range map[string][]string{
		"FROM default\nENTRYPOINT [\"/app\", \"-v\"]\nCMD [\"serve\"]\n": {"/app", "-v", "serve"},
		"FROM default\nCMD [\"serve\"]\nENTRYPOINT [\"/app\"]\n":         {"/app", "serve"}, // this Dockerfile's CMD stays
		"FROM default\nENTRYPOINT /app --shell\nCMD [\"ignored\"]\n":     {"/bin/sh", "-c", "/app --shell"},
		"FROM default\nCMD exec /app\n":                                  {"/bin/sh", "-c", "exec /app"},
		"FROM web\nRUN true\n":                                           {"/srv/run"},
		"FROM nginx:1\n":                                                 {"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"},
		"FROM nginx:1\nCMD [\"nginx-debug\"]\n":                          {"/docker-entrypoint.sh", "nginx-debug"}, // the image's ENTRYPOINT stays
		"FROM nginx:1\nENTRYPOINT [\"/run.sh\"]\n":                       {"/run.sh"},                              // and its CMD goes with it
		"FROM nginx:1\nENTRYPOINT []\nCMD []\n":                          nil,                                      // [] clears each
	} {
		p, err := parsePlan([]byte(df), ctxOf(t, nil), nil, images)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.start) != 0 || len(want) != 0 {
			if !reflect.DeepEqual(p.start, want) {
				t.Errorf("%q: start %q, want %q", df, p.start, want)
			}
		}
	}
}
