package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// Recordings, issue 34: a terminal session recorded as asciicast v2 that
// Debian's asciinema plays, with the text typed and printed; an exec
// recorded as a JSON line matching the exec; the export with the events;
// the per-VM bound cutting a flood with a marker; a VM made with
// --no-record recording nothing, and a scoped token reading none of it.
func TestRecordings(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("asciinema"); err != nil {
		t.Fatal("asciinema is missing (scripts/setup.sh installs it)")
	}
	s := testenv.Start(t, "", "--record-max", "1M")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "rec"})

	// A terminal: type a command, see its output.
	if _, err := s.Client.CreateTerminal(ctx, "rec", api.TermCreate{Name: "main"}); err != nil {
		t.Fatal(err)
	}
	tr := attach(t, s.Client, "rec", "main", client.AttachOptions{Cols: 90, Rows: 20})
	tr.send("echo $((6*7))-recorded\r")
	tr.waitFor("42-recorded", time.Minute)
	tr.close()

	// An exec with stdin.
	res, err := s.Client.Exec(ctx, "rec", api.ExecRequest{Cmd: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, Stdin: "from-stdin", User: "agent", Cwd: "/tmp"})
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("exec: %v %+v", err, res)
	}

	list, err := s.Client.Recordings(ctx, "rec")
	if err != nil || !list.Enabled {
		t.Fatalf("recordings: %+v %v", list, err)
	}
	var term, ex *api.Recording
	for i, r := range list.Recordings {
		switch {
		case r.Kind == "terminal" && strings.Contains(r.Title, "terminal main"):
			term = &list.Recordings[i]
		case r.Kind == "exec" && r.ExitCode != nil && *r.ExitCode == 3:
			ex = &list.Recordings[i]
		}
	}
	if term == nil || ex == nil || term.Actor != "admin" {
		t.Fatalf("want the terminal and the exec among %+v", list.Recordings)
	}
	castPath := filepath.Join(t.TempDir(), "s.cast")
	out, errOut, code := s.CLI("", "record", "get", "rec", term.ID)
	if code != 0 {
		t.Fatal(errOut)
	}
	os.WriteFile(castPath, []byte(out), 0o644)
	if !strings.Contains(out, `"i", "echo $((6*7))-recorded\r"`) {
		t.Fatalf("the cast lacks the typed line:\n%s", testenv.Tail(out, 3000))
	}
	// asciinema plays it (fast, without a terminal) and prints what was seen.
	play := exec.CommandContext(ctx, "asciinema", "play", "-s", "20", "-i", "0.1", castPath)
	play.Env = append(os.Environ(), "TERM=dumb")
	played, err := play.CombinedOutput()
	if err != nil || !strings.Contains(string(played), "42-recorded") {
		t.Fatalf("asciinema play: %v\n%s", err, testenv.Tail(string(played), 2000))
	}
	var er struct {
		Argv       []string `json:"argv"`
		User       string   `json:"user"`
		Cwd        string   `json:"cwd"`
		StdinBytes int64    `json:"stdin_bytes"`
		Stdout     string   `json:"stdout"`
		Stderr     string   `json:"stderr"`
		ExitCode   int      `json:"exit_code"`
		Actor      string   `json:"actor"`
		Via        string   `json:"via"`
		DurationMs int64    `json:"duration_ms"`
	}
	var eb bytes.Buffer
	if err := s.Client.Recording(ctx, "rec", ex.ID, &eb); err != nil || json.Unmarshal(eb.Bytes(), &er) != nil {
		t.Fatalf("exec recording: %v %s", err, eb.String())
	}
	if strings.Join(er.Argv, " ") != "sh -c cat; echo err >&2; exit 3" || er.User != "agent" || er.Cwd != "/tmp" || er.StdinBytes != int64(len("from-stdin")) ||
		er.Stdout != "from-stdin" || er.Stderr != "err\n" || er.ExitCode != 3 || er.Actor != "admin" || er.Via != "api" {
		t.Fatalf("exec recording %+v", er)
	}

	// The export: casts, execs, events.
	arch := filepath.Join(t.TempDir(), "rec.tar.gz")
	if _, errOut, code := s.CLI("", "record", "export", "rec", "-o", arch); code != 0 {
		t.Fatal(errOut)
	}
	files := untarGz(t, arch)
	if !strings.Contains(files["terminals/"+term.ID+".cast"], "42-recorded") || !strings.Contains(files["execs.jsonl"], "from-stdin") ||
		!strings.Contains(files["events.jsonl"], `"type":"terminal"`) {
		t.Fatalf("export holds %d files: %v", len(files), keys(files))
	}

	// A flood past the 1M bound is cut with a marker; the bound holds.
	if _, err := s.Client.CreateTerminal(ctx, "rec", api.TermCreate{Name: "flood"}); err != nil {
		t.Fatal(err)
	}
	fl := attach(t, s.Client, "rec", "flood", client.AttachOptions{Cols: 80, Rows: 24, NoScrollback: true})
	fl.send("head -c 3000000 /dev/zero | tr '\\0' y; echo; echo flood-$((1+1))-done\r")
	fl.waitFor("flood-2-done", 5*time.Minute)
	fl.close()
	waitUntil(t, "the flood's recording to be cut", time.Minute, func() (bool, string) {
		l, _ := s.Client.Recordings(ctx, "rec")
		var total int64
		cut := false
		for _, r := range l.Recordings {
			total += r.Bytes
			cut = cut || (r.Kind == "terminal" && strings.Contains(r.Title, "flood") && r.Cut)
		}
		return cut && total <= 1<<20+4096, ""
	})

	// A scoped token, even one that runs programs, reads no recording.
	tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: "rec", Allow: []string{"exec", "term"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(s.URL, tok.Secret).Recordings(ctx, "rec"); err == nil {
		t.Fatal("a scoped token listed the recordings")
	}
	if _, err := client.New(s.URL, "").Recordings(ctx, "rec"); err == nil {
		t.Fatal("no token listed the recordings")
	}

	// --no-record: nothing recorded, and a fork of it neither.
	if _, errOut, code := s.CLI("", "create", "--name", "quiet", "--memory", "512", "--no-record"); code != 0 {
		t.Fatal(errOut)
	}
	s.Exec(ctx, "quiet", "true")
	if l, err := s.Client.Recordings(ctx, "quiet"); err != nil || l.Enabled || len(l.Recordings) != 0 {
		t.Fatalf("a --no-record VM: %+v %v", l, err)
	}
	fr, err := s.Client.Fork(ctx, "quiet", 1)
	if err != nil {
		t.Fatal(err)
	}
	s.Exec(ctx, fr.Children[0].Name, "true")
	if l, _ := s.Client.Recordings(ctx, fr.Children[0].Name); l.Enabled || len(l.Recordings) != 0 {
		t.Fatalf("the fork of a --no-record VM: %+v", l)
	}
	// Deleting the VM removes its recordings.
	if err := s.Client.DeleteVM(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a deleted VM's recordings to go", time.Minute, func() (bool, string) {
		_, err := os.Stat(filepath.Join(s.DataDir, "recordings", v.ID))
		return err != nil, ""
	})
}

func untarGz(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = string(b)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
