package agent

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
)

// procRoot is where processes are read (tests may point it elsewhere).
var procRoot = "/proc"

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture (sysconf(_SC_CLK_TCK) needs cgo).
const clockTicks = 100

// procSample is what one read of /proc gives about the system.
type procSample struct {
	btime  time.Time // boot time (/proc/stat btime)
	uptime float64   // seconds since boot (/proc/uptime)
	page   int64
}

func readProcSample() procSample {
	s := procSample{page: int64(os.Getpagesize())}
	if b, err := os.ReadFile(procRoot + "/stat"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "btime "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					s.btime = time.Unix(n, 0)
				}
				break
			}
		}
	}
	if b, err := os.ReadFile(procRoot + "/uptime"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			s.uptime, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return s
}

// readProc describes one process; ok is false when it is gone (or is not a
// process directory). uidName maps a uid to a user name.
func readProc(pid int, s *procSample, uidName func(uint32) string) (api.ProcessInfo, bool) {
	dir := procRoot + "/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return api.ProcessInfo{}, false
	}
	// pid (comm) state ppid ... : comm may hold spaces and parentheses.
	st := string(stat)
	i, j := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
	if i < 0 || j < i {
		return api.ProcessInfo{}, false
	}
	comm := st[i+1 : j]
	f := strings.Fields(st[j+1:]) // f[n] is field n+3 of proc(5)
	if len(f) < 20 {
		return api.ProcessInfo{}, false
	}
	p := api.ProcessInfo{PID: pid, State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	start, _ := strconv.ParseUint(f[19], 10, 64)
	startSec := float64(start) / clockTicks
	if !s.btime.IsZero() {
		p.StartedAt = s.btime.Add(time.Duration(startSec * float64(time.Second))).UTC()
	}
	// CPUPercent is the average over the process's lifetime: CPU time used
	// divided by the time since it started (100 = one core busy).
	if elapsed := s.uptime - startSec; elapsed > 0 {
		p.CPUPercent = float64(utime+stime) / clockTicks / elapsed * 100
		p.CPUPercent = float64(int64(p.CPUPercent*10+0.5)) / 10 // one decimal
	}

	if b, err := os.ReadFile(dir + "/cmdline"); err == nil && len(b) > 0 {
		b = bytes.TrimRight(b, "\x00")
		p.Command = string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	}
	if p.Command == "" {
		p.Command = "[" + comm + "]"
	}
	if b, err := os.ReadFile(dir + "/statm"); err == nil {
		if g := strings.Fields(string(b)); len(g) > 1 {
			rss, _ := strconv.ParseInt(g[1], 10, 64)
			p.RSSBytes = rss * s.page
		}
	}
	if b, err := os.ReadFile(dir + "/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if g := strings.Fields(v); len(g) > 0 {
					if uid, err := strconv.ParseUint(g[0], 10, 32); err == nil {
						p.User = uidName(uint32(uid))
					}
				}
				break
			}
		}
	}
	return p, true
}

// listProcs reads every process in /proc, sorted by pid.
func (a *Agent) listProcs() []api.ProcessInfo {
	ents, _ := os.ReadDir(procRoot)
	s := readProcSample()
	names := map[uint32]string{}
	uidName := func(uid uint32) string {
		if n, ok := names[uid]; ok {
			return n
		}
		n := strconv.FormatUint(uint64(uid), 10)
		if u, err := a.users.lookup(n); err == nil {
			n = u.Name
		}
		names[uid] = n
		return n
	}
	out := make([]api.ProcessInfo, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if p, ok := readProc(pid, &s, uidName); ok {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

func (a *Agent) handleProcList(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, api.ProcessList{Processes: a.listProcs()})
}

func (a *Agent) handleProcSignal(w http.ResponseWriter, r *http.Request) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		writeError(w, http.StatusBadRequest, "invalid", "invalid pid "+strconv.Quote(r.PathValue("pid")))
		return
	}
	if pid == 1 {
		writeError(w, http.StatusBadRequest, "invalid", "refusing to signal pid 1 (init)")
		return
	}
	if pid == os.Getpid() {
		writeError(w, http.StatusBadRequest, "invalid", "refusing to signal the guest agent itself")
		return
	}
	sig, ok := readSignal(w, r)
	if !ok {
		return
	}
	if err := syscall.Kill(pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			writeError(w, http.StatusNotFound, "not_found", "no process "+strconv.Itoa(pid))
			return
		}
		writeError(w, http.StatusInternalServerError, "internal", "kill "+strconv.Itoa(pid)+": "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sessionPIDs lists the processes whose session id is sid.
func sessionPIDs(sid int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces and
		// parentheses): state ppid pgrp session ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 3 && f[3] == strconv.Itoa(sid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
