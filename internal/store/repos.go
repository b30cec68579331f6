package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Repo is a hosted git repository: its webhooks (the repository itself is
// a bare repository in the data dir, see package repos).
type Repo struct {
	Name      string     `json:"name"`
	Hooks     []RepoHook `json:"hooks,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
}

// RepoHook is a webhook: a POST to URL after each push, signed with
// Secret (HMAC-SHA256). AllowPrivate lets it reach loopback and private
// addresses.
type RepoHook struct {
	ID           string    `json:"id"`
	URL          string    `json:"url"`
	Secret       string    `json:"secret"`
	AllowPrivate bool      `json:"allow_private,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
}

const repoCols = `name, hooks, created_at`

var repoQ = queriesFor("repos", repoCols)

func scanRepo(sc scanner) (*Repo, error) {
	var r Repo
	var hooks string
	var created int64
	if err := sc.Scan(&r.Name, &hooks, &created); err != nil {
		return nil, err
	}
	r.CreatedAt = fromNanos(created)
	return &r, jsonCols("repo "+r.Name, hooks, &r.Hooks)
}

// CreateRepo inserts a repository; ErrConflict if its name is taken.
func (s *Store) CreateRepo(ctx context.Context, r *Repo) error {
	_, err := s.exec(ctx, repoQ.insert, r.Name, jsonText(r.Hooks), nanos(r.CreatedAt))
	return mapErr(err)
}

// UpdateRepo replaces a repository's record (its webhooks).
func (s *Store) UpdateRepo(ctx context.Context, r *Repo) error {
	res, err := s.exec(ctx, repoQ.update, jsonText(r.Hooks), nanos(r.CreatedAt), r.Name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// GetRepo finds a repository by name.
func (s *Store) GetRepo(ctx context.Context, name string) (*Repo, error) {
	r, err := scanRepo(s.queryRow(ctx, repoQ.list+` WHERE name=?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return r, err
}

// ListRepos returns every repository, by name.
func (s *Store) ListRepos(ctx context.Context) ([]*Repo, error) {
	rows, err := s.query(ctx, repoQ.list+` ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Repo
	for rows.Next() {
		r, err := scanRepo(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteRepo removes a repository's record, the VMs attached to it and
// its tokens; ErrNotFound if unknown.
func (s *Store) DeleteRepo(ctx context.Context, name string) error {
	res, err := s.exec(ctx, `DELETE FROM repos WHERE name=?`, name)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	if _, err := s.exec(ctx, `DELETE FROM repo_vms WHERE repo=?`, name); err != nil {
		return err
	}
	_, err = s.exec(ctx, `DELETE FROM tokens WHERE repo=?`, name)
	return err
}

// AttachRepo lets the VM vmID push to and pull from repo with no
// credential (one repository per VM: a second attach replaces the first).
func (s *Store) AttachRepo(ctx context.Context, vmID, repo string) error {
	if _, err := s.exec(ctx, `DELETE FROM repo_vms WHERE vm_id=?`, vmID); err != nil {
		return err
	}
	_, err := s.exec(ctx, `INSERT INTO repo_vms (vm_id, repo) VALUES (?, ?)`, vmID, repo)
	return mapErr(err)
}

// VMRepo is the repository the VM vmID is attached to ("" for none).
func (s *Store) VMRepo(ctx context.Context, vmID string) (string, error) {
	var repo string
	err := s.queryRow(ctx, `SELECT repo FROM repo_vms WHERE vm_id=?`, vmID).Scan(&repo)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return repo, err
}

// DetachRepo forgets the VM vmID's repository (its deletion).
func (s *Store) DetachRepo(ctx context.Context, vmID string) error {
	_, err := s.exec(ctx, `DELETE FROM repo_vms WHERE vm_id=?`, vmID)
	return err
}
