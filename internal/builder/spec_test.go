package builder

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const specTOML = `
from = "default"
workdir = "/opt/$app"
user = "user"

[env]
PORT = "8000"
GREETING = "a \"quoted\" $HOME"

[[steps]]
run = "echo hi > /tmp/x"
user = "root"

[[steps]]
copy = "app/"
to = "./"
owner = "user:user"
mode = "640"

[[steps]]
run = ["python3", "-c", "print(1)"]

[start]
cmd = ["python3", "-m", "http.server", "8000"]
ports = [8000]
ready = { url = "http://127.0.0.1:8000/" }
`

func TestSpecMeansItsDockerfile(t *testing.T) {
	c := ctxOf(t, map[string]string{"app/main.py": "x"})
	sp, err := parseSpec([]byte(specTOML))
	if err != nil {
		t.Fatal(err)
	}
	df, from, err := dockerfileOf(sp)
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePlan(df, c, nil, images)
	if err != nil {
		t.Fatalf("%v\n%s", err, df)
	}
	// Values are taken as written: no variable is expanded in them.
	if p.workdir != "/opt/$app" || p.env["GREETING"] != `a "quoted" $HOME` || p.user != "user" {
		t.Fatalf("plan %+v from\n%s", p, df)
	}
	if len(p.steps) != 3 || p.steps[0].user != "root" || p.steps[2].user != "user" || !reflect.DeepEqual(p.steps[0].argv, []string{"/bin/sh", "-c", "echo hi > /tmp/x"}) {
		t.Fatalf("steps of\n%s", df)
	}
	if cp := p.steps[1].copy; cp.owner != "user:user" || cp.mode != 0o640 || cp.destDir != "/opt/$app" {
		t.Fatalf("copy %+v", cp)
	}
	if !reflect.DeepEqual(p.start, []string{"python3", "-m", "http.server", "8000"}) || !reflect.DeepEqual(p.expose, []int{8000}) || p.ready[0] != "curl" {
		t.Fatalf("start %q expose %v ready %q", p.start, p.expose, p.ready)
	}
	if len(from) != strings.Count(string(df), "\n") {
		t.Fatalf("%d origins for %d lines", len(from), strings.Count(string(df), "\n"))
	}
	// JSON means the same.
	js := `{"from": "default", "workdir": "/opt/$app", "user": "user", "env": {"PORT": "8000", "GREETING": "a \"quoted\" $HOME"},
		"steps": [{"run": "echo hi > /tmp/x", "user": "root"}, {"copy": "app/", "to": "./", "owner": "user:user", "mode": "640"}, {"run": ["python3", "-c", "print(1)"]}],
		"start": {"cmd": ["python3", "-m", "http.server", "8000"], "ports": [8000], "ready": {"url": "http://127.0.0.1:8000/"}}}`
	sp2, err := parseSpec([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	df2, _, err := dockerfileOf(sp2)
	if err != nil || string(df2) != string(df) {
		t.Fatalf("JSON spec: %v\n%s\nwant\n%s", err, df2, df)
	}
}

func TestSpecRefusals(t *testing.T) {
	c := ctxOf(t, map[string]string{"a": "a"})
	for spec, want := range map[string]string{
		`steps = [{ run = "true" }]`:                                                    "spec from: missing",
		"from = \"default\"\n[[steps]]\nrun = \"x\"\ncopy = \"a\"\n":                    "spec steps[0]: a step either runs or copies",
		"from = \"default\"\n[[steps]]\ncopy = \"nope\"\nto = \"/x\"\n":                 "spec steps[0]: COPY: nope: no such file",
		"from = \"default\"\n[[steps]]\ncopy = \"a\"\nto = \"/x\"\nmode = \"9\"\n":      "mode \"9\"",
		"from = \"default\"\nbogus = 1\n":                                               "unknown key bogus",
		"from = \"default\"\n[start]\ncmd = \"x\"\nready = { port = 1, url = \"u\" }\n": "give one of port, url, cmd or timeout",
		`{"from": "default", "stepz": []}`:                                              "unknown field",
	} {
		sp, err := parseSpec([]byte(spec))
		if err == nil {
			var df []byte
			var from []string
			if df, from, err = dockerfileOf(sp); err == nil {
				_, err = parsePlan(df, c, nil, images)
				err = specError(err, from)
			}
		}
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an invalid-argument error with %q", spec, err, want)
		}
	}
}
