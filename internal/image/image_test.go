package image

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/image/codeinterp"
)

func TestRecipeHashStable(t *testing.T) {
	h := RecipeHash()
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(h) {
		t.Fatalf("RecipeHash() = %q, want 32 hex chars", h)
	}
	for i := 0; i < 3; i++ {
		if g := RecipeHash(); g != h {
			t.Fatalf("RecipeHash changed between calls: %s != %s", g, h)
		}
	}
}

func TestRecipeHashCoversRecipe(t *testing.T) {
	base := RecipeHash()
	saved := packages
	packages = append(append([]string(nil), saved...), "htop")
	changed := RecipeHash()
	packages = saved
	if changed == base {
		t.Fatal("adding a package did not change RecipeHash")
	}
	savedFiles := rootfsFiles
	rootfsFiles = append([]recipeFile(nil), savedFiles...)
	rootfsFiles[0].Content += "# changed\n"
	changed = RecipeHash()
	rootfsFiles = savedFiles
	if changed == base {
		t.Fatal("changing a written file did not change RecipeHash")
	}
	if RecipeHash() != base {
		t.Fatal("RecipeHash not restored")
	}
}

func TestImageHash(t *testing.T) {
	r := RecipeHash()
	a, b := imageHash(r, strings.Repeat("a", 64), nil), imageHash(r, strings.Repeat("b", 64), nil)
	if a == b {
		t.Fatal("different agents gave the same image hash")
	}
	if a == r || imageHash(r, strings.Repeat("a", 64), nil) != a {
		t.Fatal("image hash not deterministic or equal to recipe hash")
	}
	if imageHash("other", strings.Repeat("a", 64), nil) == a {
		t.Fatal("different recipes gave the same image hash")
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("AGENTVM_CACHE_DIR", "/x/cache")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d := DefaultCacheDir(); d != "/x/cache" {
		t.Fatalf("got %s", d)
	}
	t.Setenv("AGENTVM_CACHE_DIR", "")
	if d := DefaultCacheDir(); d != "/xdg/agentvm" {
		t.Fatalf("got %s", d)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if d := DefaultCacheDir(); d != "/home/u/.cache/agentvm" {
		t.Fatalf("got %s", d)
	}
}

func writeFakeImage(t *testing.T, cache, hash string) {
	t.Helper()
	dir := filepath.Join(cache, "images", hash)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 512)
	copy(hdr, "QFI\xfb")
	binary.BigEndian.PutUint64(hdr[24:], uint64(diskSize))
	for name, data := range map[string][]byte{kernelName: []byte("k"), initrdName: []byte("i"), diskName: hdr} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o444); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEnsureCached checks the cache key: a pre-populated image for the
// agent's hash is returned without building (no root needed); a different
// agent maps to a different key.
func TestEnsureCached(t *testing.T) {
	cache := t.TempDir()
	agent := filepath.Join(cache, "agent")
	if err := os.WriteFile(agent, []byte("agent v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := fileSHA256(agent)
	if err != nil {
		t.Fatal(err)
	}
	hash := imageHash(RecipeHash(), sum, nil)
	writeFakeImage(t, cache, hash)

	img, err := Ensure(context.Background(), Options{CacheDir: cache, AgentPath: agent})
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, "images", hash)
	if img.Hash != hash || img.Dir != want || img.Disk != filepath.Join(want, diskName) ||
		img.Kernel != filepath.Join(want, kernelName) || img.Initrd != filepath.Join(want, initrdName) {
		t.Fatalf("unexpected image %+v", img)
	}
	if img.SizeBytes != diskSize {
		t.Fatalf("SizeBytes = %d, want %d", img.SizeBytes, diskSize)
	}

	if err := os.WriteFile(agent, []byte("agent v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum2, _ := fileSHA256(agent)
	if imageHash(RecipeHash(), sum2, nil) == hash {
		t.Fatal("changing the agent did not change the image hash")
	}
}

func TestEnsureErrors(t *testing.T) {
	if _, err := Ensure(context.Background(), Options{CacheDir: t.TempDir()}); err == nil {
		t.Fatal("expected error without AgentPath")
	}
	if _, err := Ensure(context.Background(), Options{CacheDir: t.TempDir(), AgentPath: "/nonexistent/agent"}); err == nil {
		t.Fatal("expected error for missing agent")
	}
}

func TestLockExcludes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockCache(context.Background(), p, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	// flock locks are per open file description, so a second open in the
	// same process must wait too.
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	waited := false
	if _, err := lockCache(ctx, p, func(string) { waited = true }); err == nil || !waited {
		t.Fatalf("second lock: err=%v waited=%v, want timeout after waiting", err, waited)
	}
	unlock()
	unlock2, err := lockCache(context.Background(), p, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

func TestDebootstrapProgress(t *testing.T) {
	var got []string
	d := &debootstrapProgress{progress: func(s string) { got = append(got, s) }}
	d.line("I: Retrieving InRelease ")
	for i := 0; i < 5; i++ {
		d.line("I: Retrieving pkg 1.0")
		d.line("I: Validating pkg 1.0")
	}
	d.line("I: Unpacking required packages...")
	d.line("I: Unpacking libc6:amd64...")
	d.line("I: Unpacking bash...")
	d.line("I: Base system installed successfully.")
	want := []string{
		"debootstrap: Retrieving InRelease ",
		"debootstrap: downloading 5 packages",
		"debootstrap: Unpacking required packages",
		"debootstrap: unpacking 2 packages",
		"debootstrap: Base system installed successfully.",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestUnescapeMount(t *testing.T) {
	if g := unescapeMount(`/a\040b/c`); g != "/a b/c" {
		t.Fatalf("got %q", g)
	}
}

// TestBuild does a real build into $AGENTVM_CACHE_DIR (or the default cache).
// It needs root, network access to deb.debian.org and several minutes.
func TestBuild(t *testing.T) {
	if os.Getenv("AGENTVM_IMAGE_BUILD_TEST") != "1" {
		t.Skip("set AGENTVM_IMAGE_BUILD_TEST=1 to run a real image build (root, network, minutes)")
	}
	agent := os.Getenv("AGENTVM_GUEST_AGENT")
	if agent == "" {
		// Any static binary will do for the build itself.
		agent = filepath.Join(t.TempDir(), "agentvm-guest")
		src := filepath.Join(t.TempDir(), "main.go")
		os.WriteFile(src, []byte("package main\nfunc main() { select {} }\n"), 0o644)
		cmd := exec.Command("go", "build", "-o", agent, src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build fake agent: %v\n%s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	img, err := Ensure(ctx, Options{AgentPath: agent, Progress: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image: %+v", img)
	for _, p := range []string{img.Kernel, img.Initrd, img.Disk} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o444 {
			t.Errorf("%s mode %v, want 0444", p, st.Mode())
		}
	}
	if img.SizeBytes != diskSize {
		t.Errorf("SizeBytes = %d", img.SizeBytes)
	}
	// A second call is a cache hit (a rebuild takes minutes).
	start := time.Now()
	img2, err := Ensure(ctx, Options{AgentPath: agent})
	if err != nil || img2.Hash != img.Hash || time.Since(start) > time.Minute {
		t.Fatalf("second Ensure: %v %+v (%s)", err, img2, time.Since(start))
	}
}

func TestFlavors(t *testing.T) {
	for in, want := range map[string]string{"": Default, "base": Default, "default": Default,
		"code-interpreter": CodeInterpreter, "code-interpreter-v1": CodeInterpreter, "browser": Browser} {
		if got, err := Resolve(in); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Resolve("nope"); err == nil || !strings.Contains(err.Error(), "code-interpreter") {
		t.Fatalf("Resolve(nope): %v", err)
	}
	f := findFlavor(CodeInterpreter)
	if f == nil || f.recipeHash() == RecipeHash() {
		t.Fatal("the code-interpreter rootfs has the default's key")
	}
	// Its files belong to the image stage: changing one keeps the rootfs
	// (packages) but changes the image.
	sum := strings.Repeat("a", 64)
	before, rootfs := imageHash(f.recipeHash(), sum, f), f.recipeHash()
	saved := f.files
	f.files = append([]recipeFile(nil), saved...)
	f.files[0].Content += "# changed\n"
	after := imageHash(f.recipeHash(), sum, f)
	rootfsAfter := f.recipeHash()
	f.files = saved
	if after == before || rootfsAfter != rootfs {
		t.Fatalf("a flavor file change: image %s -> %s, rootfs %s -> %s", before, after, rootfs, rootfsAfter)
	}
}

// The Java kernel's class-data archive is made at image build with
// javaKernelFlags; a JVM with other flags ignores it, so the two copies of
// the flags (here and javacontext.py's jvm_flags) must agree.
func TestJavaKernelFlagsMatchTheContexts(t *testing.T) {
	src := codeinterp.Files()["javacontext.py"]
	m := regexp.MustCompile(`(?s)jvm_flags = \[(.*?)\]`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("javacontext.py has no jvm_flags list")
	}
	var flags []string
	for _, q := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(m[1], -1) {
		flags = append(flags, q[1])
	}
	if got := strings.Join(flags, " "); got != javaKernelFlags {
		t.Fatalf("javacontext.py's jvm_flags %q, flavor.go's javaKernelFlags %q", got, javaKernelFlags)
	}
}
