package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/image"
)

// debianTar returns a tar of a minimal Debian bookworm (debootstrap's
// minbase: no systemd, no kernel), the root filesystem Docker Hub's
// debian:bookworm-slim is made of; it is built once and kept in the image
// cache.
func debianTar(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(image.DefaultCacheDir(), "e2e")
	out := filepath.Join(dir, "bookworm-minbase.tar")
	if _, err := os.Stat(out); err == nil {
		return out
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp(dir, ".root-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cmd := exec.Command("debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("debootstrap: %v\n%s", err, testenv.Tail(string(b), 30))
	}
	tmp := out + ".tmp"
	if b, err := exec.Command("tar", "-C", root, "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
		"-cf", tmp, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// debianImage is debianTar as an OCI image, configured as Docker Hub's
// debian images are (PATH, CMD bash).
func debianImage(t *testing.T) v1.Image {
	t.Helper()
	debian, err := tarball.LayerFromFile(debianTar(t))
	if err != nil {
		t.Fatal(err)
	}
	base, err := mutate.AppendLayers(empty.Image, debian)
	if err != nil {
		t.Fatal(err)
	}
	return withConfig(t, base, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Cmd: []string{"bash"}})
}

// removeImage removes an image made from an OCI image from the cache, and
// the templates (cold-booted machines) of it.
func removeImage(name string) {
	cache := image.DefaultCacheDir()
	os.RemoveAll(filepath.Join(cache, "images", name))
	dirs, _ := filepath.Glob(filepath.Join(cache, "templates", "*", "template.json"))
	for _, j := range dirs {
		var tj struct {
			Image string `json:"image_hash"`
		}
		if b, err := os.ReadFile(j); err == nil && json.Unmarshal(b, &tj) == nil && tj.Image == name {
			os.RemoveAll(filepath.Dir(j))
			os.Remove(filepath.Dir(j) + ".lock")
		}
	}
}

// startRegistry serves an OCI registry (go-containerregistry's) on the
// host's loopback that answers only the login ci:s3cret.
func startRegistry(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="agentvm-e2e"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func pushImage(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"})); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func withConfig(t *testing.T, img v1.Image, c v1.Config) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", c
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

const ociServer = `use IO::Socket::INET; use Cwd;
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) { while (my $l = <$c>) { last if $l =~ /^\r?\n$/ } print $c "HTTP/1.0 200 OK\r\n\r\n$ENV{APP_GREETING} from " . getcwd() . "\n"; close $c; }
`

// TestTemplatesOCI builds templates on OCI images from a registry the test
// runs: a Debian root filesystem without systemd (as debian:bookworm-slim
// is) and an app image on it with its own ENV, WORKDIR, EXPOSE and CMD.
func TestTemplatesOCI(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	reg := startRegistry(t)

	base := debianImage(t)
	// A layer of its own each run: a new digest, so the conversion runs.
	nonce := make([]byte, 8)
	rand.Read(nonce)
	app, err := crane.Layer(map[string][]byte{"app/serve.pl": []byte(ociServer), "etc/agentvm-e2e-nonce": []byte(hex.EncodeToString(nonce))})
	if err != nil {
		t.Fatal(err)
	}
	appImg, err := mutate.AppendLayers(base, app)
	if err != nil {
		t.Fatal(err)
	}
	appImg = withConfig(t, appImg, v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "APP_GREETING=hello-oci"},
		WorkingDir: "/app", ExposedPorts: map[string]struct{}{"8080/tcp": {}}, Cmd: []string{"perl", "/app/serve.pl"}})
	pushImage(t, reg+"/team/app:v1", appImg)
	// Not Debian or Ubuntu: an os-release of Alpine's, and a shell.
	alpine, err := crane.Layer(map[string][]byte{"etc/os-release": []byte("NAME=\"Alpine Linux\"\nID=alpine\n")})
	if err != nil {
		t.Fatal(err)
	}
	alpineImg, _ := mutate.AppendLayers(empty.Image, alpine)
	pushImage(t, reg+"/team/alpine:3", withConfig(t, alpineImg, v1.Config{Cmd: []string{"/bin/sh"}}))

	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"Dockerfile": "FROM " + reg + "/team/app:v1\nRUN echo \"built in $(pwd) as $(id -un) with $APP_GREETING\" > /app/built.txt\n",
		"alpine":     "FROM " + reg + "/team/alpine:3\nRUN true\n",
		"missing":    "FROM " + reg + "/team/app:v9\n",
	})
	login := func(args ...string) *exec.Cmd {
		cmd := s.CLICmd("", append([]string{"template", "build"}, args...)...)
		cmd.Env = append(cmd.Env, "AGENTVM_REGISTRY_PASSWORD=s3cret")
		return cmd
	}
	run := func(cmd *exec.Cmd) (string, int) {
		b, err := cmd.CombinedOutput()
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatal(err)
		}
		return string(b), cmd.ProcessState.ExitCode()
	}

	t.Run("refusals", func(t *testing.T) {
		if _, errOut, code := s.CLI("", "template", "build", "ociapp", dir); code == 0 || !strings.Contains(errOut, "refused") || !strings.Contains(errOut, "--registry-user") {
			t.Fatalf("no login: %d %s", code, errOut)
		}
		if _, errOut, code := s.CLI("", "template", "build", "ociapp", dir, "--registry-user", "ci"); code == 0 || !strings.Contains(errOut, "AGENTVM_REGISTRY_PASSWORD") {
			t.Fatalf("a login without a password: %d %s", code, errOut)
		}
		if out, code := run(login("ociapp", dir, "-f", filepath.Join(dir, "missing"), "--registry-user", "ci")); code == 0 || !strings.Contains(out, "has no") {
			t.Fatalf("a missing tag: %d %s", code, out)
		}
		out, code := run(login("ocialpine", dir, "-f", filepath.Join(dir, "alpine"), "--registry-user", "ci", "--memory", "512"))
		if code == 0 || !strings.Contains(out, "the image's system is alpine: only Debian- and Ubuntu-based images") {
			t.Fatalf("an Alpine base: %d %s", code, out)
		}
		for _, n := range []string{"ociapp", "ocialpine"} {
			if _, err := s.Client.GetTemplate(ctx, n); err == nil {
				t.Fatalf("a refused build left template %s", n)
			}
		}
		waitUntil(t, "no build VM left", time.Minute, func() (bool, string) {
			vms := buildVMs(t, s)
			return len(vms) == 0, strings.Join(vms, " ")
		})
	})

	var imgName string
	t.Cleanup(func() { // if the test did not get to remove it
		if imgName != "" {
			removeImage(imgName)
		}
	})
	t.Run("an OCI base", func(t *testing.T) {
		out, code := run(login("ociapp", dir, "--registry-user", "ci"))
		if code != 0 {
			t.Fatalf("build: %d\n%s", code, out)
		}
		m := regexp.MustCompile(`is now image (oci-[0-9a-f]{16})`).FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "installing with the image's apt: systemd systemd-sysv udev kmod") {
			t.Fatalf("the build did not convert the image:\n%s", out)
		}
		imgName = m[1]
		if _, errOut, code := s.CLI("", "create", "--template", "ociapp", "--name", "obox"); code != 0 {
			t.Fatalf("create: %s", errOut)
		}
		// The image's CMD serves with its ENV in its WORKDIR; the RUN saw them too.
		r := s.Exec(ctx, "obox", `cat /proc/1/comm /app/built.txt; bash -c 'exec 3<>/dev/tcp/127.0.0.1/8080; printf "GET / HTTP/1.0\r\n\r\n" >&3; tail -n 1 <&3'`)
		if r.ExitCode != 0 || r.Stdout != "systemd\nbuilt in /app as root with hello-oci\nhello-oci from /app\n" {
			t.Fatalf("the OCI template's VM: %+v", r)
		}
		if r := s.Exec(ctx, "obox", "systemctl is-system-running; systemctl --failed --no-legend --plain"); r.Stdout != "running\n" {
			t.Errorf("the OCI image's systemd is not all well:\n%s%s", r.Stdout, r.Stderr)
		}
		tp, err := s.Client.GetTemplate(ctx, "ociapp")
		if err != nil || tp.Base != reg+"/team/app:v1" || tp.Workdir != "/app" || len(tp.Expose) != 1 || tp.Expose[0] != 8080 {
			t.Fatalf("the template: %+v %v", tp, err)
		}
	})

	t.Run("a rebuild", func(t *testing.T) {
		before, err := s.Client.GetTemplate(ctx, "ociapp")
		if err != nil {
			t.Fatal(err)
		}
		out, code := run(login("ociapp", dir, "--registry-user", "ci"))
		if code != 0 || !strings.Contains(out, "made into "+imgName+" before") || strings.Count(out, "CACHED") != 3 {
			t.Fatalf("rebuild: %d\n%s", code, out)
		}
		if after, _ := s.Client.GetTemplate(ctx, "ociapp"); after.Snapshot != before.Snapshot {
			t.Fatal("a cached rebuild made a new machine")
		}
	})

	t.Run("the image goes when nothing uses it", func(t *testing.T) {
		dir := filepath.Join(image.DefaultCacheDir(), "images", imgName)
		if _, errOut, code := s.CLI("", "template", "rm", "ociapp"); code != 0 {
			t.Fatalf("template rm: %s", errOut)
		}
		if _, errOut, code := s.CLI("", "template", "prune"); code != 0 {
			t.Fatalf("prune: %s", errOut)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the image went while a VM made from it runs: %v", err)
		}
		if r := s.Exec(ctx, "obox", "cat /app/built.txt"); r.ExitCode != 0 {
			t.Fatalf("the VM after its template went: %+v", r)
		}
		if err := s.Client.DeleteVM(ctx, "obox"); err != nil {
			t.Fatal(err)
		}
		if _, errOut, code := s.CLI("", "template", "prune"); code != 0 {
			t.Fatalf("prune: %s", errOut)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("the image stayed with nothing using it: %v", err)
		}
		tpls, _ := filepath.Glob(filepath.Join(image.DefaultCacheDir(), "templates", "*", "template.json"))
		for _, j := range tpls {
			if b, _ := os.ReadFile(j); strings.Contains(string(b), imgName) {
				t.Fatalf("its cold-booted machine stayed: %s", j)
			}
		}
	})
}
