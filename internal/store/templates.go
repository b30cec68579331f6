package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Template is a template built from a Dockerfile: a snapshot of a machine
// whose start command already answers, and what a VM made from it keeps.
type Template struct {
	Name       string            `json:"name"`
	SnapshotID string            `json:"snapshot_id"` // the built machine
	Base       string            `json:"base"`        // FROM: an image or another template
	Dockerfile string            `json:"dockerfile"`
	Layers     []string          `json:"layers"` // the keys of its cached steps, base first
	Steps      []string          `json:"steps"`  // the instructions, as written
	Start      []string          `json:"start,omitempty"`
	Ready      string            `json:"ready,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	User       string            `json:"user,omitempty"`
	Expose     []int             `json:"expose,omitempty"`
	BuildLog   string            `json:"build_log,omitempty"` // the last build's output, its end kept
	BuildMs    int64             `json:"build_ms"`
	CreatedAt  time.Time         `json:"created_at"`
	BuiltAt    time.Time         `json:"built_at"`
}

// EnvWith is the environment of a VM made from t: the template's ENV,
// with env over it.
func (t *Template) EnvWith(env map[string]string) map[string]string {
	out := make(map[string]string, len(t.Env)+len(env))
	for k, v := range t.Env {
		out[k] = v
	}
	for k, v := range env {
		out[k] = v
	}
	return out
}

const templateCols = `name, snapshot_id, base, dockerfile, layers, steps, start_cmd, ready, env, workdir, user_name, expose, build_log, build_ms, created_at, built_at`

var templateQ = queriesFor("templates", templateCols)

func templateArgs(t *Template) []any {
	return []any{t.Name, t.SnapshotID, t.Base, t.Dockerfile, jsonText(t.Layers), jsonText(t.Steps), jsonText(t.Start), t.Ready,
		jsonText(t.Env), t.Workdir, t.User, jsonText(t.Expose), t.BuildLog, t.BuildMs, nanos(t.CreatedAt), nanos(t.BuiltAt)}
}

func scanTemplate(sc scanner) (*Template, error) {
	var t Template
	var layers, steps, start, env, expose string
	var created, built int64
	if err := sc.Scan(&t.Name, &t.SnapshotID, &t.Base, &t.Dockerfile, &layers, &steps, &start, &t.Ready, &env, &t.Workdir, &t.User,
		&expose, &t.BuildLog, &t.BuildMs, &created, &built); err != nil {
		return nil, err
	}
	t.CreatedAt, t.BuiltAt = fromNanos(created), fromNanos(built)
	return &t, jsonCols("template "+t.Name, layers, &t.Layers, steps, &t.Steps, start, &t.Start, env, &t.Env, expose, &t.Expose)
}

// PutTemplate inserts a template or replaces the one of its name (a
// rebuild), keeping the first build's creation time.
func (s *Store) PutTemplate(ctx context.Context, t *Template) error {
	old, err := s.GetTemplate(ctx, t.Name)
	switch {
	case errors.Is(err, ErrNotFound):
		_, err = s.exec(ctx, templateQ.insert, templateArgs(t)...)
		return mapErr(err)
	case err != nil:
		return err
	}
	t.CreatedAt = old.CreatedAt
	_, err = s.exec(ctx, templateQ.update, updateArgs(templateArgs(t))...)
	return err
}

// GetTemplate finds a template by name.
func (s *Store) GetTemplate(ctx context.Context, name string) (*Template, error) {
	t, err := scanTemplate(s.queryRow(ctx, templateQ.list+` WHERE name=?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return t, err
}

// ListTemplates returns every template, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]*Template, error) {
	rows, err := s.query(ctx, templateQ.list+` ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTemplate removes a template record; ErrNotFound if unknown.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	r, err := s.exec(ctx, `DELETE FROM templates WHERE name=?`, name)
	if err != nil {
		return err
	}
	if k, _ := r.RowsAffected(); k == 0 {
		return ErrNotFound
	}
	return nil
}

// Layer is one cached build step: the snapshot of the machine after it,
// keyed by its parent's key and the step's exact inputs.
type Layer struct {
	Key        string    `json:"key"`
	SnapshotID string    `json:"snapshot_id"`
	Parent     string    `json:"parent"`
	Step       string    `json:"step"`
	CreatedAt  time.Time `json:"created_at"`
}

const layerCols = `key, snapshot_id, parent, step, created_at`

var layerQ = queriesFor("template_layers", layerCols)

func scanLayer(sc scanner) (*Layer, error) {
	var l Layer
	var created int64
	if err := sc.Scan(&l.Key, &l.SnapshotID, &l.Parent, &l.Step, &created); err != nil {
		return nil, err
	}
	l.CreatedAt = fromNanos(created)
	return &l, nil
}

// PutLayer records a cached step; ErrConflict if its key is cached already.
func (s *Store) PutLayer(ctx context.Context, l *Layer) error {
	_, err := s.exec(ctx, layerQ.insert, l.Key, l.SnapshotID, l.Parent, l.Step, nanos(l.CreatedAt))
	return mapErr(err)
}

// GetLayer finds a cached step by its key.
func (s *Store) GetLayer(ctx context.Context, key string) (*Layer, error) {
	l, err := scanLayer(s.queryRow(ctx, layerQ.list+` WHERE key=?`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return l, err
}

// ListLayers returns every cached step, oldest first.
func (s *Store) ListLayers(ctx context.Context) ([]*Layer, error) {
	rows, err := s.query(ctx, layerQ.list+` ORDER BY created_at, key`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Layer
	for rows.Next() {
		l, err := scanLayer(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// DeleteLayer forgets a cached step.
func (s *Store) DeleteLayer(ctx context.Context, key string) error {
	_, err := s.exec(ctx, `DELETE FROM template_layers WHERE key=?`, key)
	return err
}
