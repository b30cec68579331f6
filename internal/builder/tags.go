package builder

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/agentvm/agentvm/internal/store"
)

// Tags: a template's name means its latest build; NAME:TAG names a build
// kept under that tag (a build's own tags, or `template tag`), which later
// builds of NAME leave as it is. A tag is a template record of its own
// ("NAME:TAG"), so it keeps its machine and its cached steps as any
// template does; removing it removes only the tag. "latest" and "default"
// (E2B's) are the name itself.

var tagRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// ValidateTag checks a tag.
func ValidateTag(tag string) error {
	if !tagRe.MatchString(tag) {
		return fmt.Errorf("%w: invalid tag %q: use 1-128 letters, digits, '_', '.' and '-', not starting with '.' or '-'", ErrInvalid, tag)
	}
	return nil
}

// SplitRef splits NAME[:TAG] into a valid name and tag ("" for the
// latest build: no tag, "latest" or "default").
func SplitRef(ref string) (name, tag string, err error) {
	name, tag, _ = strings.Cut(ref, ":")
	if err := ValidateName(name); err != nil {
		return "", "", err
	}
	if tag == "latest" || tag == "default" {
		tag = ""
	}
	if tag != "" || strings.HasSuffix(ref, ":") {
		if err := ValidateTag(tag); err != nil {
			return "", "", err
		}
	}
	return name, tag, nil
}

// Ref is the record name of NAME:TAG ("" tag: the name).
func Ref(name, tag string) string {
	if tag == "" || tag == "latest" || tag == "default" {
		return name
	}
	return name + ":" + tag
}

// Canonical is ref's record name (NAME:latest and NAME:default are
// NAME), or an error for a malformed ref.
func Canonical(ref string) (string, error) {
	name, tag, err := SplitRef(ref)
	if err != nil {
		return "", err
	}
	return Ref(name, tag), nil
}

// Tag gives the build src (NAME or NAME:TAG) the tags, under src's name;
// a tag already on another build moves. "latest" makes src the name's
// latest build.
func (b *Builder) Tag(ctx context.Context, src string, tags []string) (*store.Template, error) {
	if len(tags) == 0 {
		return nil, fmt.Errorf("%w: no tags given", ErrInvalid)
	}
	name, _, err := SplitRef(src)
	if err != nil {
		return nil, err
	}
	for _, tag := range tags {
		if err := ValidateTag(tag); err != nil {
			return nil, err
		}
	}
	b.mu.Lock()
	busy := b.building[name] != nil
	b.mu.Unlock()
	if busy && hasLatest(tags) {
		return nil, fmt.Errorf("%w: template %s is being built; tag it latest after that build", ErrConflict, name)
	}
	// Under the cache's lock, as a build's record: no prune removes the
	// build between its read and its tags.
	b.gc.RLock()
	t, err := b.Get(ctx, src)
	if err == nil {
		err = b.putTags(ctx, t, name, tags)
	}
	b.gc.RUnlock()
	if err != nil {
		return nil, err
	}
	if _, err := b.Prune(ctx); err != nil && !errors.Is(err, ErrConflict) { // a moved tag's old build
		return nil, err
	}
	return t, nil
}

func hasLatest(tags []string) bool {
	for _, t := range tags {
		if Ref("x", t) == "x" {
			return true
		}
	}
	return false
}

// putTags records t under name:tag for each tag.
func (b *Builder) putTags(ctx context.Context, t *store.Template, name string, tags []string) error {
	for _, tag := range tags {
		c := *t
		c.Name = Ref(name, tag)
		if err := b.store.PutTemplate(ctx, &c); err != nil {
			return err
		}
	}
	return nil
}

// Tags lists the tags of name's builds ("latest" for the name itself, when
// it has been built), in the store's order.
func (b *Builder) Tags(ctx context.Context, name string) ([]*store.Template, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	ts, err := b.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	var out []*store.Template
	for _, t := range ts {
		if t.Name == name || strings.HasPrefix(t.Name, name+":") {
			out = append(out, t)
		}
	}
	return out, nil
}
