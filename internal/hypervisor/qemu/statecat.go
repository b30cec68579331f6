package qemu

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// StateReader is the command QEMU runs (migrate-incoming "exec:") to read a
// state file into its migration pipe. The daemon points it at its own
// binary's state-cat mode (CatState); plain cat works too, only slower.
var StateReader = []string{"cat"}

// StateCatArg is the argument that selects CatState in the agentvm binary.
const StateCatArg = "__state-cat"

// CatState writes the file at path to stdout, a pipe to QEMU: it grows the
// pipe to 1 MiB and moves pages with splice(2), where cat copies 128 KiB at a
// time through a 64 KiB pipe. Restores of a few hundred MiB wait on this.
func CatState(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	unix.FcntlInt(1, unix.F_SETPIPE_SZ, 1<<20) // best effort: the limit may be lower
	for {
		n, err := unix.Splice(int(f.Fd()), nil, 1, nil, 1<<20, unix.SPLICE_F_MORE)
		switch {
		case err == nil && n == 0:
			return nil
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL): // stdout is not a pipe
			_, err = io.Copy(os.Stdout, f)
			return err
		case err != nil:
			return err
		}
	}
}
