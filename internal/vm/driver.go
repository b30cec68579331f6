package vm

import (
	"context"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
)

// The driver seam: what the service needs of a hypervisor, as small
// interfaces. QEMU (internal/hypervisor/qemu) is the one real driver; the
// lifecycle core is unit-tested against a fake one (internal/hypervisor/fakehv).

// Hypervisor starts machines and finds the processes of machines it started
// earlier (a daemon restart re-attaches to them, or kills strays).
type Hypervisor interface {
	// Start launches a machine: a cold boot, or a restore of cfg.Incoming.
	Start(ctx context.Context, cfg qemu.Config) (Machine, error)
	// Attach connects to the running machine process pid started with cfg.
	Attach(ctx context.Context, cfg qemu.Config, pid int) (Machine, error)
	// IsOurs reports whether pid is a machine process of VM id.
	IsOurs(pid int, id string) bool
	// FindOurs lists the machine processes of VM id.
	FindOurs(id string) []int
	// Kill ends the machine process pid at once (it need not be attached).
	Kill(pid int)
	// RunningLayout is the device set the process pid was started with ("" if unknown).
	RunningLayout(pid int) string
}

// Machine is one running VM process.
type Machine interface {
	Process
	RunControl
	Migration
	DiskControl
	Hotplug
}

// Process is a machine's process: its identity, exit and ending.
type Process interface {
	PID() int
	// Done is closed when the process has exited.
	Done() <-chan struct{}
	// EventsDone is closed when every event the machine sent before it
	// exited has been read (CleanExit depends on them).
	EventsDone() <-chan struct{}
	// CleanExit reports whether the guest powered off, and why it exited.
	CleanExit() (bool, string)
	// ExitStatus describes how the process ended.
	ExitStatus() string
	// Shutdown asks the guest to power off and waits up to grace.
	Shutdown(ctx context.Context, grace time.Duration) error
	// Quit ends the process at once, cleanly on its side.
	Quit() error
	// Kill ends the process with SIGKILL.
	Kill() error
	// Close drops the connection to the process without ending it.
	Close()
}

// RunControl runs and stops the guest's vCPUs.
type RunControl interface {
	// Status is the run state ("running", "paused", "postmigrate", ...).
	Status(ctx context.Context) (string, error)
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Repause puts back in the paused state a guest that a completed save left stopped.
	Repause(ctx context.Context) error
}

// Migration saves the machine's state to a file.
type Migration interface {
	// SaveStopped stops the guest and saves its state to path; the
	// machine is left stopped.
	SaveStopped(ctx context.Context, path, format string) (qemu.SaveResult, error)
	// SaveLive saves the state while the guest runs, calls atStop in the
	// final stop, and leaves the guest running.
	SaveLive(ctx context.Context, path, format string, atStop func() error) (qemu.SaveResult, error)
	// SaveState saves a template: the device state without the RAM the
	// machine shares through its memory file; the guest is left paused.
	SaveState(ctx context.Context, path string) error
	// EndOutgoingMigration cancels a save that is still running.
	EndOutgoingMigration(ctx context.Context) error
	// ExitedDuringSave turns a save's error into one that says the process
	// exited, when it did.
	ExitedDuringSave(err error) error
}

// DiskControl changes the machine's disk chain and size.
type DiskControl interface {
	BlockResize(ctx context.Context, size int64) error
	// PrepareFreeze makes ready a freeze of the current top under a new
	// overlay newTop: commit makes the top read-only and the machine write
	// to newTop, abort undoes a freeze not committed (newTop goes).
	PrepareFreeze(ctx context.Context, newTop string) (commit func(context.Context) error, abort func(), err error)
	// DiskTop is the file the machine writes to.
	DiskTop(ctx context.Context) (string, error)
	// Flatten merges the chain above base into the top, live.
	Flatten(ctx context.Context, base string) error
}

// Hotplug adds vCPUs and memory to the running machine.
type Hotplug interface {
	AddCPUs(ctx context.Context, want int) (int, error)
	PresentCPUs(ctx context.Context) (int, error)
	SetPluggedMemory(ctx context.Context, mib int64) error
	WaitPlugged(ctx context.Context, mib int64) (int64, error)
	RequestedMemory(ctx context.Context) (int64, error)
}

// qemuDriver is the Hypervisor of real QEMU processes (through HypervisorOf).
type qemuDriver struct{}

func (qemuDriver) Start(ctx context.Context, cfg qemu.Config) (*qemu.Machine, error) {
	return qemu.Start(ctx, cfg)
}

func (qemuDriver) Attach(ctx context.Context, cfg qemu.Config, pid int) (*qemu.Machine, error) {
	return qemu.Attach(ctx, cfg, pid)
}

func (qemuDriver) IsOurs(pid int, id string) bool { return qemu.IsOurs(pid, id) }
func (qemuDriver) FindOurs(id string) []int       { return qemu.FindOurs(id) }
func (qemuDriver) Kill(pid int)                   { syscall.Kill(pid, syscall.SIGKILL) }
func (qemuDriver) RunningLayout(pid int) string   { return qemu.RunningLayout(pid) }

// MachineHypervisor is a Hypervisor whose Start and Attach return a
// concrete machine type (such as the fake of internal/hypervisor/fakehv).
type MachineHypervisor[M Machine] interface {
	Start(ctx context.Context, cfg qemu.Config) (M, error)
	Attach(ctx context.Context, cfg qemu.Config, pid int) (M, error)
	IsOurs(pid int, id string) bool
	FindOurs(id string) []int
	Kill(pid int)
	RunningLayout(pid int) string
}

// HypervisorOf adapts h to Hypervisor.
func HypervisorOf[M Machine](h MachineHypervisor[M]) Hypervisor { return adapted[M]{h} }

type adapted[M Machine] struct{ MachineHypervisor[M] }

func (a adapted[M]) Start(ctx context.Context, cfg qemu.Config) (Machine, error) {
	m, err := a.MachineHypervisor.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (a adapted[M]) Attach(ctx context.Context, cfg qemu.Config, pid int) (Machine, error) {
	m, err := a.MachineHypervisor.Attach(ctx, cfg, pid)
	if err != nil {
		return nil, err
	}
	return m, nil
}
