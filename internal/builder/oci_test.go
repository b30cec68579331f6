package builder

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// withLogin answers 401 unless the request has the login.
func withLogin(h http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"login"}]}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func TestPullOCI(t *testing.T) {
	srv := httptest.NewServer(withLogin(registry.New(registry.Logger(log.New(io.Discard, "", 0))), "ci", "s3cret"))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(256, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/usr/bin:/bin", "GREETING=hi there", "bad name=x"}, WorkingDir: "/app", User: "app",
		Entrypoint: []string{"/entry"}, Cmd: []string{"serve", "--port", "8080"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "53/udp": {}},
		Healthcheck:  &v1.HealthConfig{Test: []string{"CMD-SHELL", "curl -f localhost:8080"}}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/team/app:v1")
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	oi, b, err := pullOCI(ctx, host+"/team/app:v1", &RegistryAuth{Username: "ci", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if oi.digest != want.String() || oi.size <= 0 {
		t.Fatalf("digest %s size %d, want %s", oi.digest, oi.size, want)
	}
	if b.env["GREETING"] != "hi there" || b.env["PATH"] != "/usr/bin:/bin" || len(b.env) != 2 {
		t.Fatalf("env %v", b.env)
	}
	if b.workdir != "/app" || b.user != "app" || !slices.Equal(b.start, []string{"/entry", "serve", "--port", "8080"}) ||
		!slices.Equal(b.entry, []string{"/entry"}) || !slices.Equal(b.expose, []int{8080}) ||
		!slices.Equal(b.ready, []string{"/bin/sh", "-c", "curl -f localhost:8080"}) {
		t.Fatalf("base %+v", b)
	}

	// Not a service (no port, no health check): its command is not started.
	plain, err := mutate.Config(img, v1.Config{User: "1000:1000", Cmd: []string{"python3"}})
	if err != nil {
		t.Fatal(err)
	}
	pref, _ := name.ParseReference(host + "/team/python:3")
	if err := remote.Write(pref, plain, remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	_, pb, err := pullOCI(ctx, host+"/team/python:3", &RegistryAuth{Username: "ci", Password: "s3cret"})
	if err != nil || len(pb.start) != 0 || !slices.Equal(pb.cmd, []string{"python3"}) || pb.notStarted != "python3" || pb.user != "1000" {
		t.Fatalf("a plain image: %+v %v", pb, err)
	}

	for what, c := range map[string]struct {
		ref  string
		auth *RegistryAuth
		want string
	}{
		"no login":    {host + "/team/app:v1", nil, "refused"},
		"wrong login": {host + "/team/app:v1", &RegistryAuth{Username: "ci", Password: "no"}, "refused"},
		"no such tag": {host + "/team/app:v2", &RegistryAuth{Username: "ci", Password: "s3cret"}, "has no"},
		"bad ref":     {"UPPER/Case:!", nil, "parse"},
		"link-local":  {"169.254.169.254/x:y", nil, "link-local"},
	} {
		if _, _, err := pullOCI(ctx, c.ref, c.auth); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", what, err, c.want)
		}
	}
}

// TestPullOCITimeout: a registry that accepts and never answers fails the
// pull after registryTimeout.
func TestPullOCITimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	old := registryTimeout
	registryTimeout = 300 * time.Millisecond
	defer func() { registryTimeout = old }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = pullOCI(ctx, ln.Addr().String()+"/x:y", nil)
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("got %v, want a timeout", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the pull waited for the test's deadline, not its own")
	}
}
