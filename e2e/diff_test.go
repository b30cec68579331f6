package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// diffPaths lists a diff's entries as "A /path", "M /path", "D /path",
// leaving out what is under the prefixes given.
func diffPaths(d *api.DiffResponse, skip ...string) []string {
	var out []string
	add := func(mark string, es []api.DiffEntry) {
	next:
		for _, e := range es {
			for _, s := range skip {
				if e.Path == s || strings.HasPrefix(e.Path, s+"/") {
					continue next
				}
			}
			out = append(out, mark+" "+e.Path)
		}
	}
	add("A", d.Added)
	add("M", d.Changed)
	add("D", d.Removed)
	sort.Strings(out)
	return out
}

// The whole-machine diff, issue 34: a package installed with dpkg and files
// edited, seen from the disk layers with exact lists (since a snapshot,
// the guest's own bookkeeping left out by name), the same on the VM once
// suspended, unified diffs of the text files, the create-time identity
// since create; tokens without files, or limited to a user, refused.
func TestDiff(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "dv"})
	if r := s.Exec(ctx, "dv", "printf 'line1\\nline2\\n' > /etc/agentvm-before.conf && mkdir -p /srv/old && echo x > /srv/old/x && sync"); r.ExitCode != 0 {
		t.Fatalf("setup: %+v", r)
	}
	if _, err := s.Client.Snapshot(ctx, "dv", "dv-before"); err != nil {
		t.Fatal(err)
	}

	// A small package, built here with dpkg-deb.
	pkg := t.TempDir()
	os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "usr/share/agentvm-hello"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: agentvm-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "usr/share/agentvm-hello/README"), []byte("hello package\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "usr/bin/agentvm-hello"), []byte("#!/bin/sh\necho hello\n"), 0o755)
	deb := filepath.Join(t.TempDir(), "hello.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v %s", err, out)
	}
	b, _ := os.ReadFile(deb)
	if _, err := s.Client.WriteFile(ctx, "dv", "/root/hello.deb", bytes.NewReader(b), int64(len(b)), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	edits := "dpkg -i /root/hello.deb >/dev/null && rm /root/hello.deb" +
		" && printf 'line1\\nline2 changed\\nline3\\n' > /etc/agentvm-before.conf" +
		" && rm -r /srv/old && chmod 600 /etc/hostname" +
		" && head -c 100000 /dev/urandom > /root/blob.bin && ln -s /srv/target /root/link" +
		" && mkdir -p /root/app/__pycache__ && echo c > /root/app/__pycache__/m.pyc && echo 'print(1)' > /root/app/m.py && sync"
	if r := s.Exec(ctx, "dv", edits); r.ExitCode != 0 {
		t.Fatalf("edits: %+v", r)
	}
	// What the guest changes on its own (its logs, dpkg's and systemd's
	// bookkeeping, temporary files) is named and left out of the exact list.
	noise := []string{"/var/log", "/var/lib/dpkg", "/var/lib/systemd", "/var/cache/debconf", "/tmp", "/var/tmp", "/root/.bash_history"}
	want := []string{
		"A /root/app", "A /root/app/m.py", "A /root/blob.bin", "A /root/link",
		"A /usr/bin/agentvm-hello", "A /usr/share/agentvm-hello", "A /usr/share/agentvm-hello/README",
		"D /srv/old", "D /srv/old/x",
		"M /etc/agentvm-before.conf", "M /etc/hostname",
	}
	check := func(what string) *api.DiffResponse {
		t.Helper()
		d, err := s.Client.Diff(ctx, "dv", client.DiffOptions{Since: "dv-before", Diffs: true})
		if err != nil {
			t.Fatalf("%s: diff: %v", what, err)
		}
		if got := diffPaths(d, noise...); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s: the diff since the snapshot:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		for _, e := range d.Changed {
			switch e.Path {
			case "/etc/agentvm-before.conf":
				if !strings.Contains(e.Diff, "-line2\n+line2 changed\n+line3\n") || e.OldSize != 12 || e.Size != 26 {
					t.Fatalf("%s: the config's change: %+v", what, e)
				}
			case "/etc/hostname":
				if e.Mode&0o777 != 0o600 || len(e.What) != 1 || e.What[0] != "mode" {
					t.Fatalf("%s: hostname's change: %+v", what, e)
				}
			}
		}
		for _, e := range d.Added {
			switch e.Path {
			case "/root/blob.bin":
				if !e.Binary || e.Size != 100000 || e.Diff != "" {
					t.Fatalf("%s: the blob: %+v", what, e)
				}
			case "/root/link":
				if e.Kind != "symlink" || e.Target != "/srv/target" {
					t.Fatalf("%s: the link: %+v", what, e)
				}
			case "/usr/bin/agentvm-hello":
				if e.Mode&0o777 != 0o755 || !strings.Contains(e.Diff, "+echo hello\n") {
					t.Fatalf("%s: the package's script: %+v", what, e)
				}
			}
		}
		return d
	}
	check("running")
	// The same on the suspended VM, from its saved disk.
	if _, err := s.Client.SuspendVM(ctx, "dv"); err != nil {
		t.Fatal(err)
	}
	check("suspended")
	if v, _ := s.Client.GetVM(ctx, "dv"); v.State != api.StateSuspended {
		t.Fatalf("the diff woke the VM: %s", v.State)
	}
	// Since create: the identity the VM got, and the edits before the snapshot.
	d, err := s.Client.Diff(ctx, "dv", client.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(diffPaths(d, noise...), "\n")
	for _, w := range []string{"M /etc/machine-id", "A /etc/agentvm-before.conf", "A /usr/share/agentvm-hello/README"} {
		if !strings.Contains(got, w) {
			t.Errorf("since create: no %q in\n%s", w, got)
		}
	}
	if strings.Contains(got, "/srv/old") || strings.Contains(got, "__pycache__") {
		t.Errorf("since create: the removed /srv/old or the cache shows:\n%s", got)
	}
	// The cache shows when the defaults are off; a pattern of one's own hides more.
	d, _ = s.Client.Diff(ctx, "dv", client.DiffOptions{Since: "dv-before", NoDefaultIgnores: true, Ignore: []string{"/usr/share/agentvm-hello", "*.bin"}})
	got = strings.Join(diffPaths(d, noise...), "\n")
	if !strings.Contains(got, "A /root/app/__pycache__/m.pyc") || strings.Contains(got, "README") || strings.Contains(got, "blob.bin") {
		t.Errorf("with the defaults off and two patterns:\n%s", got)
	}
	// The CLI prints it.
	out, errOut, code := s.CLI("", "diff", "dv", "--since", "dv-before", "-p")
	if code != 0 || !strings.Contains(out, "M /etc/agentvm-before.conf") || !strings.Contains(out, "+line3") || !strings.Contains(errOut, "since dv-before") {
		t.Fatalf("agentvm diff: %d\n%s\n%s", code, out, errOut)
	}
	// Bad input and weaker tokens.
	if _, err := s.Client.Diff(ctx, "dv", client.DiffOptions{Since: "no-such-snapshot"}); err == nil || !strings.Contains(err.Error(), "no-such-snapshot") {
		t.Fatalf("since an unknown snapshot: %v", err)
	}
	for _, allow := range [][]string{{"exec"}, {"files"}} {
		tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: "dv", Allow: allow})
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.New(s.URL, tok.Secret).Diff(ctx, "dv", client.DiffOptions{Since: "dv-before"})
		if (err == nil) != (allow[0] == "files") {
			t.Fatalf("a %v token's diff: %v", allow, err)
		}
	}
	ut, _ := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: "dv", Allow: []string{"files"}, User: "agent"})
	if _, err := client.New(s.URL, ut.Secret).Diff(ctx, "dv", client.DiffOptions{}); err == nil || !strings.Contains(err.Error(), "limited to user agent") {
		t.Fatalf("a user-limited token's diff: %v", err)
	}
	if _, err := client.New(s.URL, "").Diff(ctx, "dv", client.DiffOptions{}); err == nil {
		t.Fatal("a diff with no token")
	}
}
