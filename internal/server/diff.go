package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/fsdiff"
	"github.com/agentvm/agentvm/internal/vm"
)

// diffDeadline bounds one diff.
const diffDeadline = 5 * time.Minute

// diffVM answers GET /v1/vms/{id}/diff: what changed on the VM's disk since
// its creation (since=create, the default) or since a snapshot
// (since=NAME), read from its disk layers on the host (fsdiff), with
// ignore=PATTERN (repeatable) added to the default caches, or alone with
// default_ignores=0; diffs=1 adds unified diffs of text files. Any file's
// content can be in the answer: the admin, or a files token with no user
// limit, may ask.
func (s *Server) diffVM(w http.ResponseWriter, r *http.Request) {
	if p := principal(r); !p.Admin && p.User != "" {
		writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("a diff shows every user's files: a token limited to user %s may not ask for one", p.User))
		return
	}
	q := r.URL.Query()
	since := q.Get("since")
	if since == "" {
		since = "create"
	}
	// The VM's operation lock is held while its disk is read: a diff has a
	// deadline, whatever its file system holds.
	ctx, cancel := context.WithTimeout(r.Context(), diffDeadline)
	defer cancel()
	opts := fsdiff.Options{Context: ctx}
	var err error
	if opts.Diffs, err = boolParam(q, "diffs"); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	defaults := true
	if v := q.Get("default_ignores"); v != "" {
		if defaults, err = strconv.ParseBool(v); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "default_ignores: true or false")
			return
		}
	}
	if defaults {
		opts.Ignore = append(opts.Ignore, api.DiffDefaultIgnore...)
	}
	for _, p := range q["ignore"] {
		if p == "" || len(p) > 256 || strings.ContainsRune(p, 0) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("ignore %q: a path or a pattern such as /var/cache or *.log", p))
			return
		}
		opts.Ignore = append(opts.Ignore, p)
	}
	if len(opts.Ignore) > 100 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "at most 100 ignore patterns")
		return
	}
	if v := q.Get("max_entries"); v != "" {
		if opts.MaxEntries, err = strconv.Atoi(v); err != nil || opts.MaxEntries < 1 || opts.MaxEntries > 100000 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "max_entries: 1 to 100000")
			return
		}
	}
	start := time.Now()
	view, err := s.svc.ViewDisk(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	defer view.Release()
	out := api.DiffResponse{VM: view.VM.Name, Since: since, Ignored: opts.Ignore}
	baseTop := view.Created
	out.Base = view.CreatedNote
	if since != "create" {
		sn, err := s.svc.GetSnapshot(r.Context(), since)
		if err == nil && !principal(r).Admin && sn.VMID != view.VM.ID {
			err = fmt.Errorf("%w: this VM has no snapshot %q", vm.ErrNotFound, since) // nor may a token see another VM's
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		baseTop, out.Since, out.Base = sn.Disk, sn.Name, fmt.Sprintf("snapshot %s of VM %s, taken %s", sn.Name, sn.VMName, sn.CreatedAt.Format(time.RFC3339))
	}
	if baseTop == "" {
		writeError(w, http.StatusConflict, api.CodeConflict, "this VM's disk has no file older than the VM to compare with")
		return
	}
	chain, err := fsdiff.OpenChain(view.Top)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer chain.Close()
	newer, err := fsdiff.OpenFS(chain, chain.Size())
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, api.CodeInvalid, "the VM's disk: "+err.Error())
		return
	}
	fast, olderChain := chain.Index(baseTop), chain
	if fast >= 0 {
		olderChain = chain.Below(fast)
	} else {
		if olderChain, err = fsdiff.OpenChain(baseTop); err != nil {
			writeErr(w, err)
			return
		}
		defer olderChain.Close()
	}
	older, err := fsdiff.OpenFS(olderChain, olderChain.Size())
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, api.CodeInvalid, "the disk compared with: "+err.Error())
		return
	}
	res, err := fsdiff.Compare(older, newer, chain, fast, opts)
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: the diff took longer than %s (narrow it with ignore patterns)", vm.ErrUnavailable, diffDeadline)
	}
	if err != nil {
		if errors.Is(err, fsdiff.ErrCorrupt) {
			writeError(w, http.StatusUnprocessableEntity, api.CodeInvalid, "the VM's file system cannot be read: "+err.Error())
			return
		}
		writeErr(w, err)
		return
	}
	conv := func(es []fsdiff.Entry) []api.DiffEntry {
		out := make([]api.DiffEntry, len(es))
		for i, e := range es {
			out[i] = api.DiffEntry(e)
		}
		return out
	}
	out.Added, out.Changed, out.Removed = conv(res.Added), conv(res.Changed), conv(res.Removed)
	out.Truncated, out.Scanned, out.TookMs = res.Truncated, res.Scanned, time.Since(start).Milliseconds()
	writeJSON(w, http.StatusOK, out)
}
