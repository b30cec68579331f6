package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Page merging (serve --ksm): the kernel's KSM, turned on host-wide, merges
// equal pages of the VMs' RAM, which QEMU then offers it (mem-merge=on;
// without --ksm every VM is started with mem-merge=off, so a KSM someone else
// turned on does not merge one tenant's pages with another's). KSM is left on
// when the daemon stops, since other processes may rely on it;
// `echo 2 > /sys/kernel/mm/ksm/run` turns it off and unmerges.
const ksmDir = "/sys/kernel/mm/ksm"

// enableKSM turns KSM on, with a clear error where the kernel has none or
// it cannot be changed.
func enableKSM() error {
	b, err := os.ReadFile(ksmDir + "/run")
	if err != nil {
		return fmt.Errorf("--ksm: this kernel has no KSM: %w", err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(ksmDir+"/run", []byte("1"), 0); err != nil {
		return fmt.Errorf("--ksm: turning KSM on: %w", err)
	}
	return nil
}

// ksmSavedBytes is the memory KSM saves host-wide: the pages that share a
// merged page, beyond the one kept.
func ksmSavedBytes() (int64, bool) {
	b, err := os.ReadFile(ksmDir + "/pages_sharing")
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n * int64(os.Getpagesize()), err == nil
}
