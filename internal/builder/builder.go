// Package builder builds templates from Dockerfiles: each step runs in a
// real VM, the machine after each RUN and COPY is kept as a snapshot keyed
// by its parent and its exact inputs (the cache), and the build ends by
// starting the start command, waiting until it is ready, and snapshotting
// the running machine, so that a VM made from the template is a restore
// whose service already answers.
package builder

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// ErrInvalid, ErrConflict and ErrNotFound are the vm package's, so that
// the server maps them as it maps every other.
var (
	ErrInvalid  = vm.ErrInvalid
	ErrConflict = vm.ErrConflict
	ErrNotFound = vm.ErrNotFound
)

// BuildLabel marks a build's VM.
const BuildLabel = api.TemplateBuildLabel

// StartService is the name of the service that runs a template's start
// command in its VMs.
const StartService = "template-start"

// Machines is what a build needs of the VM service.
type Machines interface {
	Create(ctx context.Context, o vm.CreateOptions) (*store.VM, bool, error)
	CreateFrom(ctx context.Context, snap string, o vm.CreateOptions) (*store.VM, bool, error)
	Guest(ctx context.Context, idOrName string) (*store.VM, *guest.Client, error)
	Snapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error)
	GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error)
	Snapshots(ctx context.Context) ([]*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, idOrName string) error
	Delete(ctx context.Context, idOrName string) error
	List(ctx context.Context) ([]*store.VM, error)
	IsLocal(v *store.VM) bool
	EnsureTemplate(ctx context.Context, imageName string, cpus int, memMiB int64) (*vm.Template, error)
	ImageNamed(ctx context.Context, name string) (*image.Image, error)
	MakeImage(ctx context.Context, name, tree string) (*image.Image, error)
	OCIImages() []string
	RemoveImage(ctx context.Context, name string) error
}

// Builder builds, lists and removes templates.
type Builder struct {
	m       Machines
	store   *store.Store
	workDir string // build contexts, unpacked
	log     *slog.Logger

	node string // this daemon's cluster node ("" alone): a cache entry elsewhere is a miss

	ctx  context.Context // ends every build when the daemon stops (Close)
	stop context.CancelFunc

	mu       sync.Mutex
	building map[string]*building // template names with a build under way
	gc       sync.RWMutex         // builds share it; a prune holds it alone
}

// building is a build under way: how to end it, and when it has.
type building struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a builder that keeps build contexts under workDir; node is
// this daemon's cluster node id ("" when not in a cluster).
func New(m Machines, st *store.Store, workDir, node string, log *slog.Logger) *Builder {
	ctx, stop := context.WithCancel(context.Background())
	return &Builder{m: m, store: st, workDir: workDir, node: node, log: log, ctx: ctx, stop: stop, building: map[string]*building{}}
}

// Close ends the builds under way and waits (up to a minute) for them to
// have deleted their VMs.
func (b *Builder) Close() {
	b.stop()
	b.mu.Lock()
	var done []chan struct{}
	for _, bl := range b.building {
		done = append(done, bl.done)
	}
	b.mu.Unlock()
	deadline := time.After(time.Minute)
	for _, d := range done {
		select {
		case <-d:
		case <-deadline:
			return
		}
	}
}

// Cancel ends the build of name under way, if any, and waits up to wait
// for it to have cleaned up; it reports whether there was one.
func (b *Builder) Cancel(name string, wait time.Duration) bool {
	b.mu.Lock()
	bl := b.building[name]
	b.mu.Unlock()
	if bl == nil {
		return false
	}
	bl.cancel()
	select {
	case <-bl.done:
	case <-time.After(wait):
	}
	return true
}

// Request is one build.
type Request struct {
	Name       string
	Context    io.Reader // a tar of the build context
	Dockerfile string    // its path in the context (default "Dockerfile")
	Spec       string    // or a spec's (TOML or JSON) path in the context, instead of a Dockerfile
	BuildArgs  map[string]string
	NoCache    bool
	CPUs       int
	MemoryMiB  int64
	DiskBytes  int64
	// ForceFromLine, when set, runs every step from this Dockerfile line
	// on again (E2B's skipCache on a step).
	ForceFromLine int
	// ReadyTimeout bounds the wait for the start command to be ready.
	ReadyTimeout time.Duration
	// Timeout bounds the whole build (default DefaultTimeout).
	Timeout time.Duration
	// Tags are given to the build too (NAME:TAG for each), besides NAME.
	Tags []string
	// RegistryAuth logs in to the registry of an OCI base (nil: the
	// daemon's Docker credentials, else none).
	RegistryAuth *RegistryAuth
}

// DefaultTimeout bounds a build that gives no Timeout: a RUN that never
// ends, or a guest that stops answering, does not hold its VM, its
// template's name and the cache forever.
const DefaultTimeout = 2 * time.Hour

// Event is one line of a build's progress.
type Event struct {
	Step        int    `json:"step,omitempty"` // 1-based; 0 for the build's own lines
	Of          int    `json:"of,omitempty"`
	Instruction string `json:"instruction,omitempty"`
	Cached      bool   `json:"cached,omitempty"`
	Log         string `json:"log,omitempty"`
}

// StepError is a failed step: which, its exit code and its last output.
type StepError struct {
	Step        int    `json:"step"`
	Line        int    `json:"line"`
	Instruction string `json:"instruction"`
	ExitCode    int    `json:"exit_code"`
	Output      string `json:"output"`
	Reason      string `json:"reason"`
	Where       string `json:"where,omitempty"` // for a spec's build: the spec's part
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("step %d (Dockerfile line %d) %s: %s", e.Step, e.Line, e.Instruction, e.Reason)
	switch {
	case e.Where != "":
		msg = fmt.Sprintf("step %d (%s) %s: %s", e.Step, e.Where, e.Instruction, e.Reason)
	case e.Line == 0:
		msg = fmt.Sprintf("step %d %s: %s", e.Step, e.Instruction, e.Reason)
	}
	if e.Output != "" {
		msg += "; its last output:\n" + e.Output
	}
	return msg
}

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidateName checks a template name.
func ValidateName(n string) error {
	if !nameRe.MatchString(n) {
		return fmt.Errorf("%w: invalid template name %q: use 1-63 lowercase letters, digits, '.', '_' and '-', starting and ending with a letter or digit", ErrInvalid, n)
	}
	return nil
}

// Build runs a build to its end, sending progress to out; on success the
// template is saved (a rebuild replaces it) and returned.
func (b *Builder) Build(ctx context.Context, req Request, out func(Event)) (*store.Template, error) {
	started := time.Now()
	if err := ValidateName(req.Name); err != nil {
		return nil, err
	}
	if _, err := image.Resolve(req.Name); err == nil {
		return nil, fmt.Errorf("%w: %q is an image's name; a template needs its own", ErrInvalid, req.Name)
	}
	for _, tag := range req.Tags {
		if err := ValidateTag(tag); err != nil {
			return nil, err
		}
	}
	if req.Spec != "" && req.Dockerfile != "" {
		return nil, fmt.Errorf("%w: a build takes a Dockerfile or a spec, not both", ErrInvalid)
	}
	if req.Dockerfile == "" {
		req.Dockerfile = "Dockerfile"
	}
	if req.ReadyTimeout <= 0 {
		req.ReadyTimeout = 5 * time.Minute
	}
	if req.Timeout <= 0 {
		req.Timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	defer context.AfterFunc(b.ctx, cancel)()
	b.mu.Lock()
	if b.building[req.Name] != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: template %s is being built; wait for that build to end", ErrConflict, req.Name)
	}
	bl := &building{cancel: cancel, done: make(chan struct{})}
	b.building[req.Name] = bl
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.building, req.Name)
		b.mu.Unlock()
		close(bl.done)
	}()

	dir := filepath.Join(b.workDir, "ctx-"+randHex(6))
	defer os.RemoveAll(dir)
	bctx, err := unpackContext(req.Context, dir)
	if err != nil {
		return nil, err
	}
	defer bctx.close()

	what, name := "the Dockerfile", req.Dockerfile
	if req.Spec != "" {
		what, name = "the spec", req.Spec
	}
	df := strings.TrimPrefix(filepath.ToSlash(filepath.Clean("/"+name)), "/")
	if bctx.kinds[df] != 0 || !bctx.has(df) {
		return nil, fmt.Errorf("%w: the build context has no file %s (%s)", ErrInvalid, name, what)
	}
	text, err := bctx.root.ReadFile(df)
	if err != nil {
		return nil, err
	}
	if df == HiddenDockerfile {
		bctx.hide(df)
	}
	var specFrom []string // the spec's part each line of its Dockerfile comes from
	if req.Spec != "" {
		sp, err := parseSpec(text)
		if err != nil {
			return nil, err
		}
		if text, specFrom, err = dockerfileOf(sp); err != nil {
			return nil, err
		}
	}
	var parent *store.Template
	var parentSnap *store.Snapshot
	var oci *ociImage
	var ociCmd string // the OCI base's command, when it is not a start command
	booted := false   // the base's template was made
	p, err := parsePlan(text, bctx, req.BuildArgs, func(name string) (*base, error) {
		if _, err := image.Resolve(name); err == nil { // an image's name or alias (built, if need be, by the create)
			return &base{}, nil
		}
		ref, err := Canonical(name)
		if err != nil { // not a template's name: an OCI image's
			ref = ""
		}
		if n, _, _ := SplitRef(ref); n == req.Name {
			// Neither its own build nor, silently, an image of that name.
			return nil, fmt.Errorf("a template is not built on its own builds, and %s in template %s is not taken for an OCI image either: name the image in full (docker.io/library/%s) or build the template under another name", name, req.Name, name)
		}
		t, err := b.store.GetTemplate(ctx, ref)
		if ref == "" || errors.Is(err, store.ErrNotFound) {
			oi, ob, err := pullOCI(ctx, name, req.RegistryAuth)
			if err != nil {
				return nil, fmt.Errorf("%s is not an image (default, code-interpreter, browser) or a template, and as an OCI image: %v", name, err)
			}
			oci, ociCmd = oi, ob.notStarted
			return ob, nil
		}
		if err != nil {
			return nil, err
		}
		if parentSnap, err = b.m.GetSnapshot(ctx, t.SnapshotID); err != nil {
			return nil, fmt.Errorf("template %s: its snapshot is gone (%v); rebuild it", name, err)
		}
		parent = t
		return &base{env: t.Env, workdir: t.Workdir, user: t.User, start: t.Start, ready: readyArgv(t.Ready), expose: t.Expose}, nil
	})
	if err != nil {
		if specFrom != nil {
			return nil, specError(err, specFrom)
		}
		return nil, err
	}

	// The cache is read and written under the lock a prune takes alone,
	// up to the template's record naming what the build made.
	b.gc.RLock()
	defer b.gc.RUnlock()

	// The shape: a template on a template keeps its parent's.
	cpus, mem, disk := req.CPUs, req.MemoryMiB, req.DiskBytes
	var baseKey string
	if parent != nil {
		if (cpus != 0 && cpus != parentSnap.CPUs) || (mem != 0 && mem != parentSnap.MemoryMiB) {
			return nil, fmt.Errorf("%w: template %s has %d vCPUs and %d MiB; a template built on it keeps that shape", ErrInvalid, parent.Name, parentSnap.CPUs, parentSnap.MemoryMiB)
		}
		cpus, mem = parentSnap.CPUs, parentSnap.MemoryMiB
		if disk < parentSnap.DiskBytes {
			disk = parentSnap.DiskBytes
		}
		baseKey = hashOf("template", parentSnap.ID, fmt.Sprint(disk)) // its machine, not its key: a rebuilt parent is a new base
	} else {
		if cpus == 0 {
			cpus = vm.DefaultCPUs
		}
		if mem == 0 {
			mem = vm.DefaultMemoryMiB
		}
		if disk == 0 {
			disk = vm.DefaultDiskBytes
		}
		probe := vm.CreateOptions{CPUs: cpus, MemoryMiB: mem, DiskBytes: disk}
		if err := probe.Validate(); err != nil {
			return nil, err
		}
		out(Event{Log: fmt.Sprintf("base image %s (%d vCPUs, %d MiB, %d MiB disk)\n", p.from, cpus, mem, disk>>20)})
		if oci != nil {
			if ociCmd != "" && len(p.start) == 0 {
				out(Event{Log: fmt.Sprintf("the image's command (%s) is not started: the image exposes no port and has no health check; give CMD to start it\n", ociCmd)})
			}
			var made bool
			if p.image, made, err = b.ociImageName(ctx, oci, req.Name, disk, out); err != nil {
				return nil, err
			}
			defer func() {
				if made && !booted { // an image that does not boot is not kept for the next build
					go b.removeUnbooted(p.image)
				}
			}()
		}
		tpl, err := b.m.EnsureTemplate(ctx, p.image, cpus, mem)
		if err != nil {
			return nil, err
		}
		booted = true
		baseKey = hashOf("image", tpl.Key, fmt.Sprint(disk))
	}

	// Every step's key, from its parent's and its inputs.
	key := baseKey
	layers := []string{baseKey}
	nonce := randHex(8) // a forced step's key is new each time
	for _, s := range p.steps {
		in, err := s.inputs(bctx)
		if err != nil {
			return nil, err
		}
		if req.ForceFromLine > 0 && s.line >= req.ForceFromLine {
			in += " force " + nonce
		}
		key = hashOf(key, in)
		s.key = key
		layers = append(layers, key)
	}
	final := hashOf(key, "start", jsonOf(p.start), jsonOf(p.ready), fmt.Sprint(p.noReady), jsonOf(sortedEnv(p.env)), p.workdir, p.user, jsonOf(p.expose))
	layers = append(layers, final)

	r := &run{b: b, req: req, p: p, files: bctx, out: out, total: len(p.steps) + 2}
	r.lines.emit = r.note
	snap, err := r.execute(ctx, parentSnap, baseKey, final, cpus, mem, disk)
	if err != nil && ctx.Err() != nil { // past its time limit, cancelled, or the daemon stopping: said once, the same way
		err = r.ended(ctx, r.cur)
	}
	var se *StepError
	if errors.As(err, &se) && specFrom != nil && se.Line >= 1 && se.Line <= len(specFrom) {
		se.Where = "spec " + specFrom[se.Line-1]
	}
	if err != nil {
		return nil, err
	}
	t := &store.Template{Name: req.Name, SnapshotID: snap, Base: p.from, Dockerfile: string(text), Layers: layers, Steps: p.text,
		Start: p.start, Ready: readyText(p.ready), Env: p.env, Workdir: p.workdir, User: p.user, Expose: p.expose,
		BuildLog: r.logTail(), BuildMs: time.Since(started).Milliseconds(), CreatedAt: time.Now().UTC(), BuiltAt: time.Now().UTC()}
	if p.noReady {
		t.Ready = ""
	}
	if err := b.store.PutTemplate(context.WithoutCancel(ctx), t); err != nil {
		return nil, err
	}
	if err := b.putTags(context.WithoutCancel(ctx), t, req.Name, req.Tags); err != nil {
		return nil, err
	}
	b.log.Info("template built", "template", t.Name, "snapshot", snap, "steps", len(p.steps), "ms", t.BuildMs)
	return t, nil
}

// HiddenDockerfile is where a client sends a Dockerfile from outside the
// context.
const HiddenDockerfile = api.HiddenDockerfile

func (c *buildContext) has(p string) bool { _, ok := c.kinds[p]; return ok }

func (c *buildContext) hide(p string) {
	delete(c.kinds, p)
	for i, x := range c.paths {
		if x == p {
			c.paths = append(c.paths[:i], c.paths[i+1:]...)
			break
		}
	}
}

// inputs is what a step's cache key covers.
func (s *step) inputs(c *buildContext) (string, error) {
	if s.copy != nil {
		d, err := s.copy.digest(c)
		return "copy " + d, err
	}
	return "run " + jsonOf(s.argv) + " env " + jsonOf(sortedEnv(s.env)) + " user " + s.user + " cwd " + s.cwd, nil
}

func sortedEnv(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// readyText is how a template keeps its ready check: a shell command as
// written, an exec form as JSON.
func readyText(argv []string) string {
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return argv[2]
	}
	if len(argv) == 0 {
		return ""
	}
	return jsonOf(argv)
}

// readyArgv turns a kept ready check back into an argv.
func readyArgv(s string) []string {
	var argv []string
	if strings.HasPrefix(s, "[") && json.Unmarshal([]byte(s), &argv) == nil {
		return argv
	}
	if s == "" {
		return nil
	}
	return []string{"/bin/sh", "-c", s}
}
