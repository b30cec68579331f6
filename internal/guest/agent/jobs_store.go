package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"golang.org/x/sys/unix"
)

// jobMeta is job.json.
type jobMeta struct {
	api.JobInfo
	// Final is set once the exit status was read from systemd.
	Final bool `json:"final,omitempty"`
}

func jobUnit(id string) string { return jobUnitPfx + id + ".service" }

func (m *jobManager) dir(id string) string { return m.a.path(filepath.Join(jobsDir, id)) }

var errNoJob = errors.New("no such job")

func (m *jobManager) load(id string) (*jobMeta, error) {
	if !jobIDRE.MatchString(id) {
		return nil, errNoJob
	}
	// The directory belongs to the job's user: no symlinks.
	b, err := readNoFollow(filepath.Join(m.dir(id), jobMetaFile))
	if os.IsNotExist(err) {
		return nil, errNoJob
	}
	if err != nil {
		return nil, err
	}
	var meta jobMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("job %s: bad %s: %v", id, jobMetaFile, err)
	}
	meta.ID = id
	if meta.Argv == nil {
		meta.Argv = []string{}
	}
	return &meta, nil
}

func (m *jobManager) save(meta *jobMeta) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(m.dir(meta.ID), jobMetaFile), b, 0o644)
}

// jobStatus applies systemctl show properties to the job. Exited is set
// once systemd has seen the main process exit (or the unit is gone).
func jobStatus(meta *jobMeta, p map[string]string) api.JobInfo {
	ji := meta.JobInfo
	ji.PID = showInt(p["MainPID"])
	if ji.PID == 0 {
		ji.PID = showInt(p["ExecMainPID"])
	}
	code, status := showInt(p["ExecMainCode"]), showInt(p["ExecMainStatus"])
	switch {
	case p["LoadState"] != "" && p["LoadState"] != "loaded":
		// The unit is gone (reboot, or collected): the status is unknown.
		ji.Exited, ji.ExitCode = true, -1
	case code == 1: // CLD_EXITED
		ji.Exited, ji.ExitCode = true, status
	case code == 2 || code == 3: // CLD_KILLED, CLD_DUMPED
		ji.Exited, ji.ExitCode = true, 128+status
		ji.Signal = unix.SignalName(syscall.Signal(status))
		if ji.Signal == "" {
			ji.Signal = "SIG" + strconv.Itoa(status)
		}
	case p["ActiveState"] == "failed" || p["ActiveState"] == "inactive":
		// Failed before the main process ran (e.g. bad user or directory:
		// systemd reports those as exit statuses 2xx, so this is rare).
		ji.Exited, ji.ExitCode = true, -1
	}
	if ji.Exited {
		if t := showTime(p["ExecMainExitTimestamp"]); !t.IsZero() {
			t = t.UTC()
			ji.EndedAt = &t
		}
	}
	return ji
}

// infos describes jobs with one systemctl call; jobs with a final status
// do not need one. The final status is recorded when first seen.
func (m *jobManager) infos(ctx context.Context, metas []*jobMeta) ([]api.JobInfo, error) {
	out := make([]api.JobInfo, len(metas))
	var idx []int
	var units []string
	for i, meta := range metas {
		if meta.Final {
			out[i] = meta.JobInfo
			continue
		}
		idx = append(idx, i)
		units = append(units, jobUnit(meta.ID))
	}
	if len(units) == 0 {
		return out, nil
	}
	blocks, err := m.sd.show(ctx, jobShowProps, units...)
	if err != nil {
		return nil, err
	}
	for k, i := range idx {
		meta := metas[i]
		out[i] = jobStatus(meta, blocks[k])
		if out[i].Exited && blocks[k]["LoadState"] == "loaded" {
			final := &jobMeta{JobInfo: out[i], Final: true}
			if err := m.save(final); err != nil && !os.IsNotExist(err) {
				m.a.logf("job %s: %v", meta.ID, err)
			}
		}
	}
	return out, nil
}

func (m *jobManager) info(ctx context.Context, meta *jobMeta) (*api.JobInfo, error) {
	infos, err := m.infos(ctx, []*jobMeta{meta})
	if err != nil {
		return nil, err
	}
	return &infos[0], nil
}

// jobWatch tells cheaply whether a job has exited: while its main process
// is alive (seen in /proc) systemd is asked only every jobShowEvery.
type jobWatch struct {
	m        *jobManager
	meta     *jobMeta
	pid      int
	lastShow time.Time
	last     *api.JobInfo
}

func (jw *jobWatch) poll(ctx context.Context) (*api.JobInfo, error) {
	if jw.last != nil && !jw.last.Exited && jw.pid > 0 && time.Since(jw.lastShow) < jobShowEvery && pidAlive(jw.pid) {
		return jw.last, nil
	}
	ji, err := jw.m.info(ctx, jw.meta)
	if err != nil {
		return nil, err
	}
	jw.last, jw.lastShow, jw.pid = ji, time.Now(), ji.PID
	return ji, nil
}

// pidAlive reports whether pid exists and is not a zombie.
func pidAlive(pid int) bool {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	j := strings.LastIndexByte(s, ')')
	return j > 0 && j+2 < len(s) && s[j+2] != 'Z' && s[j+2] != 'X'
}

func readNoFollow(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, 1<<20))
}

// openLog opens a log file without following a symlink (the directory
// belongs to the job's user); a missing file is nil.
func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return f, nil
}

// copyLogs writes the files one after the other, from offset into their
// concatenation, as they are now.
func (m *jobManager) copyLogs(w http.ResponseWriter, files []string, offset int64) {
	var readers []io.Reader
	for _, p := range files {
		f, err := openLog(p)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		if f == nil {
			continue
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			writeError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		// Only what is there now: a running job may keep writing.
		size := fi.Size()
		if offset >= size {
			offset -= size
			continue
		}
		readers = append(readers, io.NewSectionReader(f, offset, size-offset))
		offset = 0
	}
	io.Copy(w, io.MultiReader(readers...))
}

// followLog streams path from offset, polling for more, until the job has
// exited and the file is drained, or the client goes away.
func (m *jobManager) followLog(w http.ResponseWriter, r *http.Request, meta *jobMeta, path string, offset int64) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	jw := &jobWatch{m: m, meta: meta}
	buf := make([]byte, jobLogChunk)
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	exited := false
	for {
		if f == nil {
			var err error
			if f, err = openLog(path); err != nil {
				m.a.logf("job %s logs: %v", meta.ID, err)
				return
			}
		}
		if f != nil {
			for {
				n, err := f.ReadAt(buf, offset)
				if n > 0 {
					offset += int64(n)
					if _, werr := w.Write(buf[:n]); werr != nil {
						return
					}
					if rc.Flush() != nil {
						return
					}
				}
				if err != nil || n == 0 {
					break
				}
			}
		}
		if exited {
			return // drained after the exit was seen
		}
		ji, err := jw.poll(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.a.logf("job %s logs: %v", meta.ID, err)
			}
			return
		}
		if ji.Exited {
			exited = true
			continue // one more pass reads what was written before the exit
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(jobPoll):
		}
	}
}
