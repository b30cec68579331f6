package e2b

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/builder"
)

// What the Template SDK sends (captured from e2b 2.51 and 2.63) becomes
// the Dockerfile it means.
func TestTranslateSteps(t *testing.T) {
	h := strings.Repeat("ab", 32)
	sp := &buildSpec{FromImage: "e2bdev/base", StartCmd: "python app.py", ReadyCmd: `[ -n "$(ss -Htuln sport = :8000)" ]`,
		Steps: []buildStep{
			{Type: "RUN", Args: []string{"pip install flask", "root"}},
			{Type: "COPY", Args: []string{"folder/*", "/app/folder", "user", "0755"}, FilesHash: h},
			{Type: "COPY", Args: []string{"req.txt", "/app/", "", "0000"}, FilesHash: h, Force: true},
			{Type: "ENV", Args: []string{"A", "1", "B", `two "words" $HOME`}},
			{Type: "WORKDIR", Args: []string{"/app"}},
			{Type: "USER", Args: []string{"builder"}},
			{Type: "RUN", Args: []string{"whoami"}},
		}}
	tr, err := translate(sp, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	want := `FROM base
USER user
WORKDIR /home/user
USER "root"
RUN ["/bin/bash","-c","pip install flask"]
USER "user"
COPY --chown=user:user --chmod=0755 ["e2b/` + h + `/folder/*","/app/folder"]
COPY --chown=user:user ["e2b/` + h + `/req.txt","/app/"]
ENV A="1"
ENV B="two \"words\" $HOME"
WORKDIR "/app"
USER root
RUN ["/bin/sh","-c","chown \"$1\" .","sh","user:user"]
USER user
USER root
RUN ["/bin/sh","-c","id -u \"$1\" \u003e/dev/null 2\u003e\u00261 || useradd --create-home --shell /bin/bash \"$1\"","sh","builder"]
USER user
USER "builder"
RUN ["/bin/bash","-c","whoami"]
HEALTHCHECK CMD ["/bin/bash","-c","[ -n \"$(ss -Htuln sport = :8000)\" ]"]
CMD ["/bin/bash","-c","python app.py"]
`
	if string(tr.dockerfile) != want {
		t.Fatalf("got\n%s\nwant\n%s", tr.dockerfile, want)
	}
	if tr.forceLine != 8 || tr.stepOf(1) != "base" || tr.stepOf(5) != "1" || tr.stepOf(8) != "3" || tr.stepOf(19) != "7" || tr.stepOf(21) != "finalize" {
		t.Fatalf("force line %d, steps %q", tr.forceLine, tr.lineStep)
	}
	if len(tr.hashes) != 1 {
		t.Fatalf("hashes %v", tr.hashes)
	}
	// An OCI image, with a login: E2B's user is made in it.
	tr, err = translate(&buildSpec{FromImage: "registry.example.com/team/app:v1", FromImageRegistry: []byte(`{"type":"registry","username":"u","password":"p:w"}`),
		Steps: []buildStep{{Type: "RUN", Args: []string{"make"}}}}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if want := "FROM registry.example.com/team/app:v1\nENTRYPOINT []\nCMD []\nHEALTHCHECK NONE\nUSER root\n" +
		"RUN id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user\nUSER user\nWORKDIR /home/user\n"; !strings.HasPrefix(string(tr.dockerfile), want) ||
		tr.auth == nil || *tr.auth != (builder.RegistryAuth{Username: "u", Password: "p:w"}) {
		t.Fatalf("fromImage: %+v\n%s", tr.auth, tr.dockerfile)
	}
	for _, bad := range []*buildSpec{
		{FromImage: "python 3.12"},
		{FromTemplate: "base", FromImage: "e2bdev/base"},
		{FromImageRegistry: []byte(`{"type":"registry"}`), FromImage: "x"},
		{FromImageRegistry: []byte(`{"type":"aws","awsAccessKeyId":"k"}`), FromImage: "x"},
		{FromImageRegistry: []byte(`{"type":"registry","username":"u","password":"p"}`), FromTemplate: "base"},
		{Steps: []buildStep{{Type: "COPY", Args: []string{"a", "b"}}}},
		{Steps: []buildStep{{Type: "HEALTHCHECK", Args: []string{"x"}}}},
		{Steps: []buildStep{{Type: "ENV", Args: []string{"1X", "y"}}}},
		{ReadyCmd: "true"},
	} {
		if _, err := translate(bad, func(string) string { return "" }); err == nil {
			t.Errorf("%+v: translated", bad)
		}
	}
}

// TestAgeUploads: an upload no build asked for in a week goes; a recent
// one, a partial one and other files stay.
func TestAgeUploads(t *testing.T) {
	dir := t.TempDir()
	s := &Server{log: slog.New(slog.DiscardHandler), filesDir: dir}
	old, recent := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, n := range []string{old, recent, "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-uploadsKept - time.Hour)
	os.Chtimes(filepath.Join(dir, old), long, long)
	os.Chtimes(filepath.Join(dir, "notes.txt"), long, long)
	s.ageUploads(time.Now())
	for n, want := range map[string]bool{old: false, recent: true, "notes.txt": true} {
		if _, err := os.Stat(filepath.Join(dir, n)); (err == nil) != want {
			t.Errorf("%s: kept %v, want %v", n, err == nil, want)
		}
	}
	if !s.builds.ageDue() || s.builds.ageDue() {
		t.Fatal("ageDue: due once an hour")
	}
}
