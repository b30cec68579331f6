package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

const envFile = "/etc/agentvm/env"

// envReaders is the group that may read envFile (the code interpreter's user).
const envReaders = "user"

// handleInfo says who the guest is: its hostname, boot, kernel taint and
// uptime (the boot id and taint read under the agent's root).
func (a *Agent) handleInfo(w http.ResponseWriter, r *http.Request) {
	info := guest.Info{Version: guest.Version, Proto: guest.ProtoVersion}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		info.Hostname = unix.ByteSliceToString(uts.Nodename[:])
	}
	if b, err := os.ReadFile(a.path("/proc/sys/kernel/random/boot_id")); err == nil {
		info.BootID = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(a.path("/proc/sys/kernel/tainted")); err == nil {
		info.Tainted, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) == nil {
		info.UptimeMS = ts.Nano() / 1e6
	}
	writeJSON(w, info)
}

func (a *Agent) handleIdentity(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var id guest.Identity
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&id); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad identity JSON: "+err.Error())
		return
	}
	if err := validateIdentity(&id); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	steps := map[string]int64{}
	if err := a.applyIdentity(&id, steps); err != nil {
		writeError(w, http.StatusInternalServerError, "identity_failed", err.Error())
		return
	}
	writeJSON(w, guest.IdentityResult{OK: true, MS: time.Since(start).Milliseconds(), StepsUS: steps})
}

func validateIdentity(id *guest.Identity) error {
	if id.Hostname != "" {
		if len(id.Hostname) > 64 || strings.ContainsAny(id.Hostname, " \t\n/\x00") {
			return fmt.Errorf("invalid hostname %q", id.Hostname)
		}
	}
	if id.MachineID != "" {
		if len(id.MachineID) != 32 || strings.Trim(strings.ToLower(id.MachineID), "0123456789abcdef") != "" {
			return fmt.Errorf("machine_id must be 32 hex characters")
		}
	}
	for k := range id.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("invalid env name %q", k)
		}
	}
	if id.Network != nil && id.Network.Address == "" {
		return errors.New("network.address is required")
	}
	return nil
}

// applyIdentity applies every part it can and reports all failures.
func (a *Agent) applyIdentity(id *guest.Identity, steps map[string]int64) error {
	var errs []error
	last := time.Now()
	last0 := last
	fail := func(what string, err error) {
		if steps != nil {
			now := time.Now()
			steps[what] = now.Sub(last).Microseconds()
			last = now
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	sys := !a.opts.NoSystem

	if len(id.Seed) > 0 {
		fail("seed rng", writeFile("/dev/urandom", id.Seed, 0))
	}
	if id.Hostname != "" {
		if sys {
			fail("sethostname", unix.Sethostname([]byte(id.Hostname)))
		}
		fail("write /etc/hostname", writeFile(a.path("/etc/hostname"), []byte(id.Hostname+"\n"), 0o644))
		fail("update /etc/hosts", a.updateHosts(id.Hostname))
	}
	if id.Env != nil {
		fail("write env", a.storeEnv(id.Env))
	}
	var netErr chan error
	if id.Network != nil && sys {
		netErr = make(chan error, 1)
		go func() { netErr <- configureNetwork(id.Network) }()
	}
	if id.Network != nil {
		if len(id.Network.DNS) > 0 {
			var b strings.Builder
			for _, d := range id.Network.DNS {
				b.WriteString("nameserver " + d + "\n")
			}
			fail("write resolv.conf", writeFile(a.path("/etc/resolv.conf"), []byte(b.String()), 0o644))
		}
	}
	if id.MachineID != "" {
		err := writeFile(a.path("/etc/machine-id"), []byte(strings.ToLower(id.MachineID)+"\n"), 0o444)
		fail("write machine-id", err)
		if err == nil && sys {
			go func() {
				// Do not wait, and start late: forking systemctl right after a
				// restore competes for the vCPU with the first requests.
				time.Sleep(3 * time.Second)
				if out, err := exec.Command("systemctl", "--no-block", "restart", "systemd-journald").CombinedOutput(); err != nil {
					a.logf("restart journald: %v: %s", err, bytes.TrimSpace(out))
				}
			}()
		}
	}
	if netErr != nil {
		fail("configure network", <-netErr)
	}
	// The clock goes last: setting it wakes every timerfd armed with
	// TFD_TIMER_CANCEL_ON_SET (systemd and friends), and that work would
	// otherwise compete with the steps above for the vCPU.
	if id.TimeUnixNano > 0 && sys {
		// Add the time spent since the request arrived (monotonic), so the
		// clock matches the host's at the moment it is set.
		ts := unix.NsecToTimespec(id.TimeUnixNano + time.Since(last0).Nanoseconds())
		fail("set clock", unix.ClockSettime(unix.CLOCK_REALTIME, &ts))
	}
	if id.DiskResize && sys {
		if out, err := exec.Command("resize2fs", "/dev/vda").CombinedOutput(); err != nil {
			fail("resize2fs", fmt.Errorf("%v: %s", err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// setClock sets the guest's wall clock to the host's clock from a
// handshake's START line, before the session it starts serves anything: a
// wake then needs no identity push. It runs before the first request, so a
// failure can only be logged.
func (a *Agent) setClock(host time.Time) {
	if a.opts.SetClock != nil {
		a.opts.SetClock(host)
		return
	}
	if a.opts.NoSystem {
		return
	}
	ts := unix.NsecToTimespec(host.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		a.logf("set clock from the handshake: %v", err)
	}
}

// writeFile writes path in place: overwrite, then shrink to the new length. It
// avoids O_TRUNC on purpose: truncating an ext4 file to zero makes its close
// start writeback (auto_da_alloc), which costs ~100 ms right after a restore
// under TCG. perm 0 keeps the mode of an existing file and is for device files.
func writeFile(path string, data []byte, perm os.FileMode) error {
	flag := os.O_WRONLY | os.O_CREATE
	if perm == 0 {
		flag = os.O_WRONLY
	}
	f, err := os.OpenFile(path, flag, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && perm != 0 {
		err = f.Truncate(int64(len(data)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// updateHosts sets the "127.0.1.1 <hostname>" line of /etc/hosts.
func (a *Agent) updateHosts(hostname string) error {
	p := a.path("/etc/hosts")
	old, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	want := "127.0.1.1\t" + hostname
	var out []string
	found := false
	for _, l := range strings.Split(strings.TrimRight(string(old), "\n"), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "127.0.1.1" {
			if !found {
				out = append(out, want)
				found = true
			}
			continue
		}
		if l != "" || len(out) > 0 {
			out = append(out, l)
		}
	}
	if !found {
		if len(out) == 0 {
			out = append(out, "127.0.0.1\tlocalhost")
		}
		out = append(out, want)
	}
	return writeFile(p, []byte(strings.Join(out, "\n")+"\n"), 0o644)
}

func (a *Agent) storeEnv(env map[string]string) error {
	m := make(map[string]string, len(env))
	for k, v := range env {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	p := a.path(envFile)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	a.env.Store(&m)
	if err := writeFile(p, b, 0o600); err != nil {
		return err
	}
	// The code interpreter runs as user "user" and reads the VM's variables
	// from here: the file is root's, readable by that group alone.
	if g, err := user.LookupGroup(envReaders); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil && os.Chown(p, 0, gid) == nil {
			return os.Chmod(p, 0o640)
		}
	}
	return os.Chmod(p, 0o600)
}
