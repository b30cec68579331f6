package record

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readCast(t *testing.T, s *Store, vm, id string) (castHeader, [][3]any) {
	t.Helper()
	rc, kind, err := s.Open(vm, id)
	if err != nil || kind != "terminal" {
		t.Fatalf("open %s: %v %s", id, err, kind)
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var h castHeader
	var evs [][3]any
	for i := 0; sc.Scan(); i++ {
		if i == 0 {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				t.Fatalf("header %q: %v", sc.Text(), err)
			}
			continue
		}
		var ev [3]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return h, evs
}

// A terminal's recording is an asciicast v2 file: the header, then output,
// input and resizes with their times; a character split between two
// chunks stays whole, invalid bytes become U+FFFD.
func TestCast(t *testing.T) {
	s := New(Config{Dir: t.TempDir()})
	c := s.Terminal("vm1", "main", "agent", "admin", 100, 30)
	c.Output([]byte("héllo \xe2\x82"), false)
	c.Output([]byte("\xac done \xff\n"), false)
	c.Input([]byte("ls\r"))
	c.Resize(120, 40)
	c.Close()
	c.Output([]byte("after close"), false) // nothing, no panic
	var nilCast *Cast
	nilCast.Output([]byte("x"), false)
	nilCast.Close()
	list, err := s.List("vm1")
	if err != nil || len(list) != 1 || list[0].Kind != "terminal" || list[0].User != "agent" || list[0].Actor != "admin" {
		t.Fatalf("list %+v %v", list, err)
	}
	h, evs := readCast(t, s, "vm1", list[0].ID)
	if h.Version != 2 || h.Width != 100 || h.Height != 30 {
		t.Fatalf("header %+v", h)
	}
	var out strings.Builder
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev[1].(string))
		if ev[1] == "o" {
			out.WriteString(ev[2].(string))
		}
	}
	if out.String() != "héllo € done \uFFFD\n" {
		t.Fatalf("output %q", out.String())
	}
	if strings.Join(kinds, ",") != "o,o,i,r" || evs[3][2] != "120x40" {
		t.Fatalf("events %v", evs)
	}
}

// Past the VM's bound the oldest recordings go; one that alone exceeds it
// is cut with a marker, and an exec's output is capped.
func TestBounds(t *testing.T) {
	evicted := make(chan int, 10)
	s := New(Config{Dir: t.TempDir(), MaxPerVM: 200 << 10, Evicted: func(vm string, n int, first time.Time) {
		if vm == "vm1" && !first.IsZero() {
			evicted <- n
		}
	}})
	old := s.Exec("vm1", Exec{Command: "true", Actor: "admin"})
	old.Done(0, "", false)
	time.Sleep(2 * time.Millisecond)
	c := s.Terminal("vm1", "flood", "root", "admin", 0, 0)
	chunk := bytes.Repeat([]byte("y\n"), 16<<10)
	for i := 0; i < 20; i++ {
		c.Output(chunk, false)
	}
	c.Close()
	list, _ := s.List("vm1")
	if len(list) != 1 || list[0].Kind != "terminal" || !list[0].Cut {
		t.Fatalf("after the flood: %+v (want only the cut terminal: the old exec evicted)", list)
	}
	if list[0].Bytes > 200<<10+200 {
		t.Fatalf("the cut recording holds %d bytes, bound 200 KiB", list[0].Bytes)
	}
	select {
	case n := <-evicted:
		if n != 1 {
			t.Fatalf("evicted %d, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the eviction was not told")
	}
	e := s.Exec("vm2", Exec{Command: "cat", Actor: "token:t"})
	e.Input(make([]byte, 1000))
	e.Output(bytes.Repeat([]byte("o"), maxExecOutput+10), false)
	e.Output([]byte("err"), true)
	e.Done(3, "", false)
	e.Done(0, "", false) // the first wins
	rc, kind, err := s.Open("vm2", e.e.ID)
	if err != nil || kind != "exec" {
		t.Fatal(err)
	}
	var got Exec
	json.NewDecoder(rc).Decode(&got)
	rc.Close()
	if got.ExitCode != 3 || got.StdinBytes != 1000 || len(got.Stdout) != maxExecOutput || !got.StdoutTruncated || got.StdoutBytes != maxExecOutput+10 || got.Stderr != "err" {
		t.Fatalf("exec record %+v", got)
	}
	// Bad ids are refused, not opened.
	for _, id := range []string{"../vm1", "exec-x", "term-20261206T000000.000000000-zzzzzz", ""} {
		if _, _, err := s.Open("vm2", id); err == nil {
			t.Errorf("opened %q", id)
		}
	}
	if _, err := s.List("../x"); err == nil {
		t.Error("listed a bad VM id")
	}
}

// Off stops new recordings (a nil recorder) and is kept; Forget and Prune
// remove recordings.
func TestOffForgetPrune(t *testing.T) {
	dir := t.TempDir()
	s := New(Config{Dir: dir, Retention: time.Hour})
	s.Exec("vm1", Exec{Command: "a"}).Done(0, "", false)
	if err := s.SetEnabled("vm1", false); err != nil {
		t.Fatal(err)
	}
	if s.Enabled("vm1") || s.Exec("vm1", Exec{}) != nil || s.Terminal("vm1", "t", "u", "a", 1, 1) != nil {
		t.Fatal("recording while off")
	}
	s.SetEnabled("vm1", true)
	if !s.Enabled("vm1") {
		t.Fatal("not on again")
	}
	list, _ := s.List("vm1")
	if len(list) != 1 {
		t.Fatalf("%+v", list)
	}
	p := filepath.Join(dir, "vm1", list[0].ID+".jsonl")
	os.Chtimes(p, time.Now().Add(-2*time.Hour), time.Now().Add(-2*time.Hour))
	s.Prune(time.Now())
	if list, _ := s.List("vm1"); len(list) != 0 {
		t.Fatalf("after the prune: %+v", list)
	}
	s.Exec("vm1", Exec{Command: "b"}).Done(0, "", false)
	s.Forget("vm1")
	if _, err := os.Stat(filepath.Join(dir, "vm1")); err == nil {
		t.Fatal("Forget left the VM's directory")
	}
}

func TestExport(t *testing.T) {
	s := New(Config{Dir: t.TempDir()})
	c := s.Terminal("vm1", "main", "root", "admin", 80, 24)
	c.Output([]byte("hi\n"), false)
	c.Close()
	s.Exec("vm1", Exec{Command: "echo 1"}).Done(0, "", false)
	s.Exec("vm1", Exec{Command: "echo 2"}).Done(1, "", false)
	var buf bytes.Buffer
	if err := s.Export("vm1", &buf, []byte(`{"seq":1}`+"\n")); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = string(b)
	}
	if strings.Count(files["execs.jsonl"], "\n") != 2 || !strings.Contains(files["execs.jsonl"], "echo 2") || files["events.jsonl"] != `{"seq":1}`+"\n" || files["index.json"] == "" {
		t.Fatalf("archive %v", files)
	}
	n := 0
	for name, b := range files {
		if strings.HasPrefix(name, "terminals/term-") && strings.HasSuffix(name, ".cast") && strings.Contains(b, `"hi\n"`) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("casts in the archive: %v", files)
	}
}
