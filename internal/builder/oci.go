package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/vm"
)

// An OCI image as a base (FROM python:3.12-slim, FROM host/team/app:tag):
// its manifest and config are read when the Dockerfile is planned; its
// files become a guest image once per digest (image.OCIName): a build VM
// of the default image unpacks them, adds systemd where the image has
// none (Debian- and Ubuntu-based images only, with the image's own apt),
// and sends the tree back, which the image package packs with agentvm's
// kernel and guest agent. The image's code only ever runs in that VM.

// RegistryAuth is a registry login for a build's OCI base. Without one, the
// daemon's own Docker credentials (~/.docker/config.json) are used, else
// none.
type RegistryAuth struct {
	Username string
	Password string
}

// ociImage is an OCI base, resolved.
type ociImage struct {
	ref    string
	img    v1.Image
	digest string
	size   int64 // its layers, compressed
}

// registryTimeout bounds each registry answer's wait (a registry that
// accepts and says nothing fails the build, it does not hold it).
var registryTimeout = time.Minute

// registryBackoff retries a failed registry call twice, 1 and 2 s later.
var registryBackoff = remote.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 3}

// ociPackages are what a guest needs from its image: systemd as init, udev
// for the agent's port, kmod to load modules, resize2fs for a bigger disk.
var ociPackages = []string{"systemd", "systemd-sysv", "udev", "kmod", "dbus", "e2fsprogs", "ca-certificates", "iproute2", "procps"}

// pullOCI reads an OCI image's manifest and config for linux/amd64.
func pullOCI(ctx context.Context, ref string, auth *RegistryAuth) (*ociImage, *base, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		remote.WithTransport(registryTransport()), remote.WithRetryBackoff(registryBackoff)}
	if auth != nil {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: auth.Username, Password: auth.Password}))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, nil, registryError(r, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, registryError(r, err)
	}
	if cf.OS != "" && cf.OS != "linux" || cf.Architecture != "" && cf.Architecture != "amd64" {
		return nil, nil, fmt.Errorf("OCI image %s is for %s/%s; VMs here are linux/amd64", r, cf.OS, cf.Architecture)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, nil, registryError(r, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, registryError(r, err)
	}
	oi := &ociImage{ref: r.String(), img: img, digest: d.String()}
	for _, l := range layers {
		if s, err := l.Size(); err == nil {
			oi.size += s
		}
	}
	return oi, ociBase(&cf.Config), nil
}

func registryTransport() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: refuseLinkLocal}
	t.DialContext = d.DialContext
	t.ResponseHeaderTimeout = registryTimeout
	t.TLSHandshakeTimeout = min(10*time.Second, registryTimeout)
	return t
}

// refuseLinkLocal keeps pulls away from link-local addresses (a cloud's
// metadata service answers there). Loopback and private registries are
// allowed: a registry on the host itself is a common setup.
func refuseLinkLocal(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast()) {
		return fmt.Errorf("registry address %s is link-local: refused", host)
	}
	return nil
}

// registryError says what a registry answered, in a line.
func registryError(r name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("registry %s refused %s (HTTP %d): give a login with --registry-user (and check its rights)", r.Context().RegistryStr(), r, te.StatusCode)
		case http.StatusNotFound:
			return fmt.Errorf("registry %s has no %s", r.Context().RegistryStr(), r)
		}
	}
	return fmt.Errorf("pulling %s: %v", r, err)
}

// ociBase is what a Dockerfile on the image starts from: its environment,
// working directory, user, ports, start command and health check.
func ociBase(c *v1.Config) *base {
	user, _, _ := strings.Cut(c.User, ":") // USER user:group: the user, whose group applies
	b := &base{env: map[string]string{}, workdir: c.WorkingDir, user: user}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && ValidEnvName(k) {
			b.env[k] = v
		}
	}
	// An image that exposes a port or checks its health is a service: its
	// ENTRYPOINT and CMD are the start command. Others (python's CMD
	// python3, node's, debian's bash) are interactive: a service of them
	// would exit at once, so they are not started (a CMD in the Dockerfile
	// starts what it says).
	// The ENTRYPOINT goes in front of a Dockerfile's CMD either way.
	b.entry, b.cmd = c.Entrypoint, c.Cmd
	all := append(append([]string(nil), c.Entrypoint...), c.Cmd...)
	shell := len(c.Entrypoint) == 0 && len(c.Cmd) == 1 && (path.Base(c.Cmd[0]) == "bash" || path.Base(c.Cmd[0]) == "sh")
	if (len(c.ExposedPorts) > 0 || c.Healthcheck != nil && len(c.Healthcheck.Test) > 1) && !shell {
		b.start = all
	} else if len(all) > 0 {
		b.notStarted = strings.Join(all, " ")
	}
	for p := range c.ExposedPorts {
		num, proto, _ := strings.Cut(p, "/")
		if n, err := strconv.Atoi(num); err == nil && n > 0 && n < 65536 && (proto == "" || proto == "tcp") {
			b.expose = append(b.expose, n)
		}
	}
	if h := c.Healthcheck; h != nil && len(h.Test) > 1 {
		switch h.Test[0] {
		case "CMD":
			b.ready = h.Test[1:]
		case "CMD-SHELL":
			b.ready = []string{"/bin/sh", "-c", h.Test[1]}
		}
	}
	return b
}

// ociTree is where a build VM unpacks an image.
const ociTree = "/var/tmp/agentvm-oci"

// ociPrepare runs in the build VM, as root: it checks the image's system
// and installs what it lacks of ociPackages with the image's own apt.
var ociPrepare = `set -eu
R=` + ociTree + `
osr=$R/etc/os-release
[ -f "$osr" ] || osr=$R/usr/lib/os-release
id=$(sed -n 's/^ID=//p' "$osr" 2>/dev/null | tr -d '"' | head -1)
like=$(sed -n 's/^ID_LIKE=//p' "$osr" 2>/dev/null | tr -d '"' | head -1)
case " $id $like " in
*" debian "*|*" ubuntu "*) ;;
*) echo "the image's system is ${id:-not named (no /etc/os-release)}: only Debian- and Ubuntu-based images can be a template's base" >&2; exit 64;;
esac
missing=
for p in ` + strings.Join(ociPackages, " ") + `; do
	s=$(chroot "$R" dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$s" = installed ] || missing="$missing $p"
done
if [ -z "$missing" ]; then
	echo "the image has systemd and the rest a guest needs"
	exit 0
fi
echo "installing with the image's apt:$missing"
mkdir -p "$R/proc" "$R/sys" "$R/dev"
cleanup() { umount -R "$R/proc" "$R/sys" "$R/dev" 2>/dev/null || true; rm -f "$R/usr/sbin/policy-rc.d"; }
trap cleanup EXIT
mount -t proc proc "$R/proc"
mount -t sysfs sys "$R/sys"
mount --rbind /dev "$R/dev"
rm -f "$R/etc/resolv.conf"
cp /etc/resolv.conf "$R/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"
chmod 755 "$R/usr/sbin/policy-rc.d"
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
chroot "$R" apt-get update -q
chroot "$R" apt-get install -y -q --no-install-recommends $missing
chroot "$R" apt-get clean
rm -rf "$R"/var/lib/apt/lists/*
`

// ociImageName returns the guest image oi becomes, making it first if this
// host has not: in a build VM (labelled for the template), its tree sent
// back and packed by the image package.
func (b *Builder) ociImageName(ctx context.Context, oi *ociImage, tmpl string, disk int64, out func(Event)) (string, bool, error) {
	def, err := b.m.ImageNamed(ctx, image.Default)
	if err != nil {
		return "", false, err
	}
	imgName := image.OCIName(oi.digest, ociPrepare, def)
	if _, err := b.m.ImageNamed(ctx, imgName); err == nil {
		out(Event{Log: fmt.Sprintf("OCI image %s (%s): made into %s before\n", oi.ref, oi.digest, imgName)})
		return imgName, false, nil
	}
	out(Event{Log: fmt.Sprintf("OCI image %s (%s, %d MiB compressed): unpacking it in a build VM\n", oi.ref, oi.digest, oi.size>>20)})
	o := vm.CreateOptions{Name: "build-" + randHex(5), DiskBytes: max(disk, 16<<30),
		Labels: map[string]string{BuildLabel: tmpl}, Env: map[string]string{}}
	v, _, err := b.m.Create(ctx, o)
	if v != nil {
		defer func() {
			if err := b.m.Delete(context.WithoutCancel(ctx), v.ID); err != nil {
				b.log.Warn("deleting a build's VM", "vm", v.ID, "err", err)
			}
		}()
	}
	if err != nil {
		return "", false, fmt.Errorf("starting the VM that unpacks the OCI image: %w", err)
	}
	_, g, err := b.m.Guest(ctx, v.ID)
	if err != nil {
		return "", false, fmt.Errorf("the VM that unpacks the OCI image: %w", err)
	}
	lines := &lineWriter{emit: func(l string) { out(Event{Log: l}) }}
	// The image's layers, flattened (whiteouts applied), into the VM's tar.
	files := mutate.Extract(oi.img)
	defer files.Close()
	if err := runIn(ctx, g, "mkdir -p "+ociTree+" && tar -x -C "+ociTree+" --numeric-owner -p --xattrs --xattrs-include='*' -f -", files, nil, lines); err != nil {
		return "", false, fmt.Errorf("unpacking OCI image %s: %w", oi.ref, err)
	}
	if err := runIn(ctx, g, ociPrepare, nil, lines, lines); err != nil {
		return "", false, fmt.Errorf("preparing OCI image %s: %w", oi.ref, err)
	}
	lines.flush()
	out(Event{Log: "packing the image's files with agentvm's kernel and guest agent\n"})
	// The tree holds the image's set-id programs: its parent is the daemon's alone.
	parent := filepath.Join(b.workDir, "oci-"+randHex(6))
	defer os.RemoveAll(parent)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", false, err
	}
	tree := filepath.Join(parent, "root")
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := extractTree(ctx, pr, tree, image.DiskSize)
		if err == nil {
			io.CopyN(io.Discard, pr, 1<<20) // tar's end padding
		}
		pr.CloseWithError(err) // the tar's writes fail, which ends it in the VM (runIn)
		done <- err
	}()
	err = runIn(ctx, g, "tar -c -C "+ociTree+" --one-file-system --numeric-owner --xattrs --xattrs-include=security.capability -f - .", nil, pw, lines)
	pw.CloseWithError(err)
	if xerr := <-done; xerr != nil {
		return "", false, fmt.Errorf("OCI image %s: %w", oi.ref, xerr)
	}
	if err != nil {
		return "", false, fmt.Errorf("reading back OCI image %s: %w", oi.ref, err)
	}
	if _, err := b.m.MakeImage(ctx, imgName, tree); err != nil {
		return "", false, fmt.Errorf("OCI image %s: %w", oi.ref, err)
	}
	out(Event{Log: fmt.Sprintf("OCI image %s is now image %s\n", oi.ref, imgName)})
	return imgName, true, nil
}

// removeUnbooted removes an image a build made whose first cold boot
// failed, once no build holds the cache (one may have found it made and
// be booting it), trying for a minute; else a prune removes it.
func (b *Builder) removeUnbooted(name string) {
	for range 60 {
		if b.gc.TryLock() {
			err := b.m.RemoveImage(b.ctx, name)
			b.gc.Unlock()
			b.log.Info("removed an image made from an OCI image that did not boot", "image", name, "err", err)
			return
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// runIn runs a shell script in the guest as root; a non-zero exit is an
// error carrying the script's last stderr lines (through stderr, a
// *lineWriter, when given). A failed stdin fails the command.
func runIn(ctx context.Context, g *guest.Client, script string, stdin io.Reader, stdout io.Writer, stderr *lineWriter) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req := guest.ExecRequest{Shell: script, Env: map[string]string{"LC_ALL": "C"}}
	if stdin != nil {
		req.Stdin = true
	}
	s, err := g.Exec(ctx, req)
	if err != nil {
		return err
	}
	defer s.Close()
	if stdin != nil {
		go func() {
			if _, err := io.Copy(s, stdin); err != nil {
				cancel(err)
				return
			}
			s.CloseStdin()
		}()
	}
	if stdout == nil {
		stdout = io.Discard
	}
	stdout = &cancelOnError{w: stdout, cancel: cancel}
	var errOut io.Writer = io.Discard
	if stderr != nil {
		errOut = stderr
	}
	st, err := s.Wait(stdout, errOut)
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	if err != nil {
		return err
	}
	if st.ExitCode != 0 || st.Signal != "" {
		why := fmt.Sprintf("exit code %d", st.ExitCode)
		if st.Signal != "" {
			why = "killed by " + st.Signal
		}
		if stderr != nil {
			stderr.flush()
			if t := stderr.tail(); t != "" {
				return fmt.Errorf("%s: %s", why, t)
			}
		}
		return errors.New(why)
	}
	return nil
}

// cancelOnError ends the exec when what it writes to cannot take more
// (the guest's stream is read on, and dropped, by ExecStream.Wait).
type cancelOnError struct {
	w      io.Writer
	cancel context.CancelCauseFunc
}

func (c *cancelOnError) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.cancel(err)
	}
	return n, err
}
