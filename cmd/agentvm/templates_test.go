package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentvm/agentvm/api"
)

// The build context the CLI sends: what .dockerignore excludes is left
// out, the Dockerfile never is, and one from outside comes last under its
// hidden name.
func TestTarContext(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		".dockerignore": "secret.key\nbuild/\ndocker/\n!build/keep.txt\n", "secret.key": "s", "app/main.py": "x",
		"build/out.o": "o", "build/keep.txt": "k", "docker/app.Dockerfile": "FROM default\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(t.TempDir(), "Dockerfile")
	os.WriteFile(outside, []byte("FROM default\nRUN true\n"), 0o644)
	names := func(keep, hidden string) []string {
		var buf bytes.Buffer
		if err := tarContext(&buf, dir, hidden, keep); err != nil {
			t.Fatal(err)
		}
		var out []string
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return out
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				out = append(out, h.Name)
			}
		}
	}
	got := names("docker/app.Dockerfile", "")
	slices.Sort(got)
	if want := []string{".dockerignore", "app/main.py", "build/keep.txt", "docker/app.Dockerfile"}; !slices.Equal(got, want) {
		t.Fatalf("sent %q, want %q", got, want)
	}
	got = names(api.HiddenDockerfile, outside)
	if got[len(got)-1] != api.HiddenDockerfile || slices.Contains(got, "docker/app.Dockerfile") || slices.Contains(got, "secret.key") {
		t.Fatalf("with a Dockerfile from outside: %q", got)
	}
}

// A diff's names and contents come from the guest: their control
// characters are shown, not run.
func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain\ttext\n": "plain\ttext\n",
		"a\x1b[2Jb":     `a\x1b[2Jb`,
		"hidden\rline":  `hidden\x0dline`,
		"é ok":          "é ok",
		"c1\u009bx":     `c1\x9bx`,
	} {
		if got := visible(in); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
}
