package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// The records a build leaves (templates, cached steps, their snapshots),
// read and removed: list, get, delete, prune, and the clean-up at start.

// Cleanup deletes the VMs of builds a previous daemon did not finish, and
// the snapshots of steps it saved but never recorded.
func (b *Builder) Cleanup(ctx context.Context) {
	os.RemoveAll(b.workDir)
	b.removeUnrecorded(ctx)
	vms, err := b.m.List(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if _, ok := v.Labels[BuildLabel]; ok && b.m.IsLocal(v) {
			b.log.Info("deleting the VM of an unfinished template build", "vm", v.ID, "template", v.Labels[BuildLabel])
			b.m.Delete(ctx, v.ID)
		}
	}
}

// layerNameRe is the name a build gives a step's snapshot (run.layer);
// vm refuses it for other snapshots.
var layerNameRe = regexp.MustCompile(`^layer-[0-9a-f]{16}-[0-9a-f]{6}$`)

// removeUnrecorded deletes this node's layer-* snapshots that neither a
// cached step nor a template names (a daemon stopped between a step's
// snapshot and its record).
func (b *Builder) removeUnrecorded(ctx context.Context) {
	snaps, err := b.m.Snapshots(ctx)
	if err != nil {
		return
	}
	known := map[string]bool{}
	ls, err := b.store.ListLayers(ctx)
	if err != nil {
		return
	}
	for _, l := range ls {
		known[l.SnapshotID] = true
	}
	ts, err := b.store.ListTemplates(ctx)
	if err != nil {
		return
	}
	for _, t := range ts {
		known[t.SnapshotID] = true
	}
	for _, sn := range snaps {
		if layerNameRe.MatchString(sn.Name) && strings.HasPrefix(sn.VMName, "build-") && !known[sn.ID] && sn.Node == b.node {
			b.log.Info("deleting the snapshot of a template build step never recorded", "snapshot", sn.Name)
			b.m.DeleteSnapshot(ctx, sn.ID)
		}
	}
}

// List returns every template.
func (b *Builder) List(ctx context.Context) ([]*store.Template, error) {
	return b.store.ListTemplates(ctx)
}

// Get returns a template by name, or a tagged build by NAME:TAG.
func (b *Builder) Get(ctx context.Context, ref string) (*store.Template, error) {
	name, err := Canonical(ref)
	if err != nil {
		return nil, err
	}
	t, err := b.store.GetTemplate(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no template named %q", ErrNotFound, name)
	}
	return t, err
}

// Delete removes a template (its latest build; NAME:TAG removes only that
// tag) and every cached step no other template uses.
func (b *Builder) Delete(ctx context.Context, ref string) error {
	name, err := Canonical(ref)
	if err != nil {
		return err
	}
	b.mu.Lock()
	busy := b.building[name] != nil
	b.mu.Unlock()
	if busy {
		return fmt.Errorf("%w: template %s is being built", ErrConflict, name)
	}
	ts, err := b.store.ListTemplates(ctx)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if base, err := Canonical(t.Base); err == nil && base == name {
			return fmt.Errorf("%w: template %s is built on %s; remove it first", ErrConflict, t.Name, name)
		}
	}
	if err := b.store.DeleteTemplate(ctx, name); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: no template named %q", ErrNotFound, name)
	} else if err != nil {
		return err
	}
	// Its steps go now, unless a build holds the cache: then at the next prune.
	if _, err := b.Prune(ctx); err != nil && !errors.Is(err, ErrConflict) {
		return err
	}
	return nil
}

// Prune deletes every cached step (and its snapshot) that no template
// uses, and returns how many; then the images made from OCI images that
// nothing was made from.
func (b *Builder) Prune(ctx context.Context) (int, error) {
	if !b.gc.TryLock() {
		return 0, fmt.Errorf("%w: a template build is under way; prune after it", ErrConflict)
	}
	defer b.gc.Unlock()
	ts, err := b.store.ListTemplates(ctx)
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	for _, t := range ts {
		for _, k := range t.Layers {
			used[k] = true
		}
		used["snap:"+t.SnapshotID] = true
	}
	ls, err := b.store.ListLayers(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, l := range ls {
		if used[l.Key] || used["snap:"+l.SnapshotID] {
			continue
		}
		if err := b.m.DeleteSnapshot(ctx, l.SnapshotID); err != nil && !errors.Is(err, vm.ErrNotFound) {
			errs = append(errs, fmt.Errorf("cached step %s: %w", l.Key[:12], err))
			continue
		}
		if err := b.store.DeleteLayer(ctx, l.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	// The images made from OCI images that no VM or snapshot (a cached
	// step's, a template's) was made from any more.
	if b.m != nil {
		for _, name := range b.m.OCIImages() {
			if err := b.m.RemoveImage(ctx, name); err == nil {
				b.log.Info("removed an image made from an OCI image: nothing uses it", "image", name)
			} else if !errors.Is(err, vm.ErrConflict) {
				errs = append(errs, fmt.Errorf("image %s: %w", name, err))
			}
		}
	}
	return n, errors.Join(errs...)
}

// Uses names the template or cached step that needs a snapshot ("" for
// none): such a snapshot is removed with its template, not alone.
func (b *Builder) Uses(ctx context.Context, snapID string) string {
	ts, _ := b.store.ListTemplates(ctx)
	for _, t := range ts {
		if t.SnapshotID == snapID {
			return "template " + t.Name
		}
	}
	ls, _ := b.store.ListLayers(ctx)
	for _, l := range ls {
		if l.SnapshotID == snapID {
			return "a cached template build step (agentvm template prune removes those no template uses)"
		}
	}
	return ""
}
