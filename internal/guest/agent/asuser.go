package agent

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// asUser runs fn with u's file-system credentials (fsuid, fsgid and
// supplementary groups), so that the kernel enforces u's permissions on
// every path operation fn makes. fn must make its file syscalls on the
// calling goroutine; file descriptors it opens may be used anywhere later.
//
// The credentials are per-thread: fn runs on a fresh goroutine locked to its
// OS thread, the credentials are set with thread-local syscalls (the
// golang.org/x/sys/unix wrappers are plain raw syscalls, unlike
// syscall.Setgroups which Go applies to every thread), and the goroutine
// exits without UnlockOSThread, so the runtime destroys the tainted thread
// instead of reusing it. Setting fsuid to a non-zero uid also drops the
// file-system capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, ...)
// from that thread. Root runs fn directly.
func asUser(u *userInfo, fn func() error) error {
	if u.UID == 0 {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic as user %s: %v\n%s", u.Name, p, debug.Stack())
			}
		}()
		if err := setThreadCreds(u); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// setThreadCreds switches the calling thread's file-system credentials.
func setThreadCreds(u *userInfo) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("cannot act as user %s: the agent is not running as root", u.Name)
	}
	groups := u.Groups
	if len(groups) == 0 {
		groups = []uint32{u.GID}
	}
	gids := make([]int, len(groups))
	for i, g := range groups {
		gids[i] = int(g)
	}
	if err := unix.Setgroups(gids); err != nil {
		return fmt.Errorf("setgroups for user %s: %w", u.Name, err)
	}
	// setfsuid/setfsgid report failure only by not changing the value:
	// read it back with an invalid id (-1 changes nothing).
	unix.SetfsgidRetGid(int(u.GID))
	if cur, _ := unix.SetfsgidRetGid(-1); cur != int(u.GID) {
		return fmt.Errorf("setfsgid %d for user %s failed", u.GID, u.Name)
	}
	unix.SetfsuidRetUid(int(u.UID))
	if cur, _ := unix.SetfsuidRetUid(-1); cur != int(u.UID) {
		return fmt.Errorf("setfsuid %d for user %s failed", u.UID, u.Name)
	}
	// A non-zero fsuid drops only the file-system capabilities: drop the rest
	// too (CAP_SYS_RESOURCE would let the user write into ext4's reserved
	// blocks and past quotas, CAP_SYS_ADMIN much more), as a setuid process
	// would. Pid 0 is this thread only; it is never reused.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("drop capabilities for user %s: %w", u.Name, err)
	}
	return nil
}
