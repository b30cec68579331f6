// Package vm is the VM service: lifecycle state machine, create-from-template,
// exec access and reconciliation after a daemon restart.
package vm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/store"
)

// Sentinel errors; the server maps them to HTTP statuses in one place.
var (
	ErrInvalid      = errors.New("invalid argument")
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrInsufficient = errors.New("insufficient host resources")
	ErrUnavailable  = errors.New("unavailable")
	// ErrNoListener: the VM runs but nothing accepts connections on the
	// port (always together with ErrUnavailable).
	ErrNoListener = errors.New("nothing listens on the port")
	// ErrGuestDial: the VM runs but a connection into it failed otherwise
	// (always together with ErrUnavailable).
	ErrGuestDial = errors.New("cannot connect into the VM")
)

// Config configures the service.
type Config struct {
	DataDir     string // vms/<id>/ lives here
	RunDir      string // short directory for unix sockets (<108 bytes paths)
	CacheDir    string // image cache
	TemplateDir string // template snapshots (default CacheDir/templates)
	QEMU        string // qemu-system-x86_64 binary
	QEMUVersion string
	Accel       string // kvm or tcg (already resolved)
	// KSM offers the VMs' RAM to the host's page merging (serve --ksm;
	// the server turns KSM itself on, ksm.go).
	KSM       bool
	AgentPath string // agentvm-guest binary baked into the image
	// BootTimeout bounds a cold boot until the agent answers.
	BootTimeout time.Duration
	Policy      network.Policy
	Log         *slog.Logger
	// ImageProgress receives image build step lines.
	ImageProgress func(string)
	// PoolSize is how many warm VMs to keep per recently created shape (0: none).
	PoolSize int
	// StateFormat is how saves of a VM's memory are written: "auto" (the
	// default) writes suspends as a stream, which a wake reads whole, and
	// snapshots and forks in the page format, whose RAM file the VMs made
	// from them map and share; qemu.FormatMapped as auto but suspends with
	// QEMU's mapped-ram (a wake reads only the pages the file holds, in
	// place; a stream on a QEMU before 9.0, and in a cluster that stores
	// suspended VMs); or qemu.FormatPages or qemu.FormatStream for every
	// save. Measured: bench/RESULTS.md.
	StateFormat string
	// StateCat is the agentvm binary QEMU runs to read a saved state
	// (qemu.Config.StateCat; "": plain cat).
	StateCat string
	// Hypervisor starts and finds machines (nil: QEMU).
	Hypervisor Hypervisor
	// Node is this daemon's cluster node id ("" outside a cluster): new
	// VMs are recorded on it, and only its VMs are run here.
	Node string
	// NodeLost, in a cluster, says whether node id's lease has run out (or
	// the node is gone): its VMs run nowhere, and a delete forgets them.
	NodeLost func(ctx context.Context, id string) (bool, error)
	// Objects, if not nil, is the object store snapshots (objects.go) and,
	// in a cluster, suspended VMs (vmstore.go) are kept in, from where any
	// compatible node restores them.
	Objects *objects.Store
	// EnsureImage builds or finds an image (nil: image.Ensure, which
	// builds Debian images with debootstrap).
	EnsureImage func(ctx context.Context, o image.Options) (*image.Image, error)
}

// StateFormatAuto: suspends as a stream, snapshots and forks as pages.
const StateFormatAuto = "auto"

// ValidStateFormat checks a Config.StateFormat ("" is auto).
func ValidStateFormat(f string) error {
	if f == "" || f == StateFormatAuto {
		return nil
	}
	if err := qemu.ValidFormat(f); err != nil {
		return fmt.Errorf("%w (or %s)", err, StateFormatAuto)
	}
	return nil
}

// suspendFormat and captureFormat are the save formats of a suspend and of
// a snapshot or fork.
func (s *Service) suspendFormat() string {
	switch {
	case s.cfg.StateFormat == qemu.FormatPages:
		return qemu.FormatPages
	case s.cfg.StateFormat != qemu.FormatMapped:
		return qemu.FormatStream
	case s.cfg.Objects != nil && s.cfg.Node != "":
		// A suspended VM is stored in the object store (vmstore.go), which
		// reads and hashes every byte of a file: a mapped-ram file's
		// apparent size is the boot memory plus the 16 GiB of hot-plug
		// room (qemu.HotplugMemoryMiB), holes included.
		return qemu.FormatStream
	}
	return qemu.FormatMapped // a stream where QEMU is older than 9.0
}

func (s *Service) captureFormat() string {
	if s.cfg.StateFormat == qemu.FormatStream {
		return qemu.FormatStream
	}
	return qemu.FormatPages
}

// Service owns all VMs of one data dir.
type Service struct {
	*journal // events and the VMs' logs (events.go)
	activity // when each VM was last used (policy.go)
	*images  // the guest images, each built once (images.go)

	cfg Config
	// refusals counts admit's refusals: [0] memory, [1] disk.
	refusals [2]atomic.Int64
	store    Store
	log      *slog.Logger
	hv       Hypervisor
	tpl      *templates

	mu        sync.Mutex
	instances map[string]*instance // running VMs by id
	ops       opLocks
	onDelete  []func(vmID string)                   // see OnDelete
	onFork    []func(parentID, childID string)      // see OnFork
	onOp      []func(op string, took time.Duration) // see OnOp
	snapLocks map[string]*sync.RWMutex

	pool *warmPool

	unfinished unfinished // machines started and not yet published or ended

	syncs sync.WaitGroup // saved states being synced to disk (syncSaved)
	// pendingLayers are disk layers made for a capture that no record
	// names yet (path -> struct{}): gcLayers leaves them alone.
	pendingLayers sync.Map

	// stash stores snapshots and suspended VMs in the object store and
	// fetches them from it (stash.go).
	stash *stash
	nets  *Networks // private networks and each VM's network (nets.go)

	fence fence // this node's fence (node.go)
}

// New creates the service. Call Reconcile before serving requests.
func New(cfg Config, st Store) (*Service, error) {
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(cfg.CacheDir, "templates")
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
		if cfg.Accel == "tcg" {
			cfg.BootTimeout = 180 * time.Second
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := ValidStateFormat(cfg.StateFormat); err != nil {
		return nil, err
	}
	for _, d := range []string{filepath.Join(cfg.DataDir, "vms"), filepath.Join(cfg.DataDir, "layers"), filepath.Join(cfg.DataDir, "snapshots"), cfg.RunDir, cfg.TemplateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	hv := cfg.Hypervisor
	if hv == nil {
		hv = HypervisorOf(qemuDriver{})
	}
	s := &Service{cfg: cfg, store: durable{st}, log: cfg.Log, hv: hv, instances: map[string]*instance{}, activity: activity{started: time.Now()},
		pool: newWarmPool(cfg.PoolSize)}
	s.images = &images{ensure: cfg.EnsureImage, cacheDir: cfg.CacheDir, agentPath: cfg.AgentPath, progress: cfg.ImageProgress,
		user: imageUser(cfg.DataDir)}
	if s.images.ensure == nil {
		s.images.ensure = image.Ensure
	}
	s.journal = &journal{store: s.store, log: cfg.Log, logPath: func(id string) string { return s.paths(id).Log }}
	s.stash = newStash(cfg.Objects, cfg.DataDir, cfg.Log)
	s.nets = &Networks{store: s.store, log: cfg.Log, policy: cfg.Policy,
		live: func(id string) *network.Network {
			if in := s.instance(id); in != nil {
				return in.net
			}
			return nil
		},
		each: func(fn func(id string, n *network.Network) bool) {
			s.mu.Lock()
			defer s.mu.Unlock()
			for id, in := range s.instances {
				if in.net != nil && !fn(id, in.net) {
					return
				}
			}
		},
		event: func(id string, data map[string]string, format string, args ...any) {
			s.EventData(id, "network", ActorSystem, data, format, args...)
		}}
	s.tpl = &templates{dir: cfg.TemplateDir, runDir: cfg.RunDir, qemuVersion: cfg.QEMUVersion, accel: cfg.Accel,
		bootTimeout: cfg.BootTimeout, hv: hv, log: cfg.Log, machineConfig: s.machineConfig, unfinished: &s.unfinished,
		newNetwork: func() (*network.Network, error) {
			return network.New(s.nets.config(0), cfg.Log.With("vm", "template"))
		}}
	return s, nil
}

// Accel returns the accelerator in use.
func (s *Service) Accel() string { return s.cfg.Accel }

// OnDelete registers fn to run after a VM is gone, however it went (a
// delete request, a delete-after policy, a failed create or fork), for the
// side effects that live outside this package (live connections, proxy
// routes, TCP listeners).
func (s *Service) OnDelete(fn func(vmID string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onDelete = append(s.onDelete, fn)
}

// OnFork registers fn to be called with a parent's and a child's id once
// a fork's child is made (whoever forked it), e.g. to give the child what
// the parent has outside the VM service.
func (s *Service) OnFork(fn func(parentID, childID string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onFork = append(s.onFork, fn)
}

func (s *Service) instance(id string) *instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instances[id]
}

// setInstance records (or, with nil, forgets) the live side of VM id. On
// a fenced node a new instance is killed instead, and false returned: an
// operation that was starting a machine when the fence came must not
// leave it running (Unfence records what became of the VM).
func (s *Service) setInstance(id string, in *instance) bool {
	s.mu.Lock()
	fenced := in != nil && s.fence.why() != ""
	switch {
	case in == nil:
		delete(s.instances, id)
	case fenced:
		s.fence.kill(id)
	default:
		s.instances[id] = in
	}
	s.mu.Unlock()
	if fenced {
		in.kill()
	}
	return !fenced
}

// paths are every file of one VM, named in one place.
type paths struct {
	Dir, Disk, Log, Run, QMP, Agent, Net string
}

func (s *Service) paths(id string) paths {
	dir := filepath.Join(s.cfg.DataDir, "vms", id)
	run := filepath.Join(s.cfg.RunDir, id)
	return paths{
		Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), Log: filepath.Join(dir, "vm.log"),
		Run: run, QMP: filepath.Join(run, "qmp.sock"), Agent: filepath.Join(run, "agent.sock"), Net: filepath.Join(run, "net.sock"),
	}
}

// GuestMAC is the fixed MAC of every VM's NIC: each VM sits alone on its own network.
const GuestMAC = "5a:94:ef:e4:0c:ee"

// kernelAppend is the guest kernel command line; part of the template key.
// Under TCG the CPU side-channel mitigations are turned off: the emulated guest does
// not speculate, and page-table isolation makes every guest syscall flush QEMU's
// software TLB, which slows everything the guest does several times over.
func kernelAppend(accel string) string {
	// memhp_default_state=online: memory plugged through virtio-mem (a live
	// resize) comes online as soon as the guest adds it.
	a := "root=/dev/vda rw console=ttyS0 quiet loglevel=3 net.ifnames=0 panic=-1 systemd.show_status=false memhp_default_state=online"
	if accel == "tcg" {
		a += " mitigations=off norandmaps"
	}
	return a
}

func (s *Service) machineConfig(v *store.VM, p paths, img *image.Image) qemu.Config {
	return qemu.Config{
		ID: v.ID, Binary: s.cfg.QEMU, Accel: s.cfg.Accel, CPUModel: qemu.CPUModel(s.cfg.Accel),
		CPUs: v.CPUs, MemoryMiB: v.MemoryMiB - v.HotMemoryMiB, PluggedMiB: v.HotMemoryMiB, Kernel: img.Kernel, Initrd: img.Initrd, Append: kernelAppend(s.cfg.Accel),
		Disk: s.diskPath(v), QMPSock: p.QMP, AgentSock: p.Agent, NetSock: p.Net, LogPath: p.Log,
		MAC: GuestMAC, VMGenID: newUUID(), Layout: layoutOf(v), StateCat: s.cfg.StateCat,
		MemMerge: s.cfg.KSM, OOMScoreAdj: oomScore(v.State),
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func hashStrings(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// Close destroys the warm pool and detaches from all other VMs without stopping
// them: QEMU outlives the daemon. A machine still being made (a create, a
// wake or a template build under way) is killed: nothing would finish it.
func (s *Service) Close() {
	if n := s.unfinished.kill(); n > 0 {
		s.log.Warn("stopping: killed the machines still being started", "machines", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s.drainPool(ctx)
	cancel()
	for _, in := range s.takeInstances() {
		in.detach()
	}
	// A state saved at shutdown (the server suspends its VMs) must reach
	// the disk before the daemon exits: a host rebooting next would find it
	// unsynced and count its memory lost.
	s.syncs.Wait()
	s.stash.close()
}

// takeInstances empties the instance map and returns what it held.
func (s *Service) takeInstances() []*instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	ins := make([]*instance, 0, len(s.instances))
	for _, in := range s.instances {
		ins = append(ins, in)
	}
	s.instances = map[string]*instance{}
	return ins
}

// diskPath is the writable top of a VM's disk chain.
func (s *Service) diskPath(v *store.VM) string {
	if v.Disk != "" {
		return v.Disk
	}
	return s.paths(v.ID).Disk
}

// layers holds disk layers that can outlive their VM: every VM's writable top
// and the frozen layers that snapshots and forks share.
func (s *Service) layers() disk.Layers {
	return disk.Layers{Dir: filepath.Join(s.cfg.DataDir, "layers")}
}

func (s *Service) newLayerPath(id string) string { return s.layers().NewPath(id) }
