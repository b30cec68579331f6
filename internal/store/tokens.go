package store

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// Token is a scoped API token. Only a hash of its secret is stored.
type Token struct {
	ID        string    `json:"id"`
	Hash      string    `json:"hash"` // hex sha256 of the whole token string
	VMID      string    `json:"vm_id"`
	Allow     []string  `json:"allow"`
	User      string    `json:"user,omitempty"` // "" = any user
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// SSHKeys are public keys (authorized_keys format) that authenticate to
	// the SSH gateway with this token's scope.
	SSHKeys []string `json:"ssh_keys,omitempty"`
	// Repo, for a repository token, is the hosted git repository it opens
	// (VMID is then ""), Allow holding read or read and write; Branches,
	// when set, is the glob the branches it may push to must match.
	Repo     string `json:"repo,omitempty"`
	Branches string `json:"branches,omitempty"`
}

// tokenCols are the tokens table's columns, the key first.
const tokenCols = tokenCols6 + `, repo, branches`

// tokenCols6 are the columns of tokens at schema 6 (see vmCols6).
const tokenCols6 = `id, hash, vm_id, allow, user_name, name, created_at, expires_at, ssh_keys`

var tokenQ = queriesFor("tokens", tokenCols)

func tokenArgs(t *Token) []any {
	return []any{t.ID, t.Hash, t.VMID, jsonText(t.Allow), t.User, t.Name, nanos(t.CreatedAt), nanos(t.ExpiresAt), jsonText(t.SSHKeys), t.Repo, t.Branches}
}

// CreateToken inserts a token.
func (s *Store) CreateToken(ctx context.Context, t *Token) error {
	_, err := s.exec(ctx, tokenQ.insert, tokenArgs(t)...)
	return mapErr(err)
}

func scanTokens(rows *sql.Rows) ([]*Token, error) {
	defer rows.Close()
	var out []*Token
	for rows.Next() {
		var t Token
		var allow, keys string
		var created, expires int64
		if err := rows.Scan(&t.ID, &t.Hash, &t.VMID, &allow, &t.User, &t.Name, &created, &expires, &keys, &t.Repo, &t.Branches); err != nil {
			return nil, err
		}
		t.CreatedAt, t.ExpiresAt = fromNanos(created), fromNanos(expires)
		if err := jsonCols("token "+t.ID, allow, &t.Allow, keys, &t.SSHKeys); err != nil {
			return nil, err
		}
		out = append(out, &t)
	}
	return out, rows.Err()
}

// TokenByHash finds an unexpired token by the hash of its secret.
func (s *Store) TokenByHash(ctx context.Context, hash string, now time.Time) (*Token, error) {
	return s.oneToken(ctx, `hash=?`, hash, now)
}

// TokenByID finds an unexpired token by its id.
func (s *Store) TokenByID(ctx context.Context, id string, now time.Time) (*Token, error) {
	return s.oneToken(ctx, `id=?`, id, now)
}

func (s *Store) oneToken(ctx context.Context, where string, arg any, now time.Time) (*Token, error) {
	rows, err := s.query(ctx, tokenQ.list+` WHERE `+where+` AND expires_at>?`, arg, now.UnixNano())
	if err != nil {
		return nil, err
	}
	ts, err := scanTokens(rows)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, ErrNotFound
	}
	return ts[0], nil
}

// LiveTokens returns which of ids are tokens that have not expired (nor
// been deleted).
func (s *Store) LiveTokens(ctx context.Context, ids []string, now time.Time) (map[string]bool, error) {
	out := map[string]bool{}
	for len(ids) > 0 {
		n := min(len(ids), 500)
		chunk := ids[:n]
		ids = ids[n:]
		args := make([]any, 0, n+1)
		for _, id := range chunk {
			args = append(args, id)
		}
		args = append(args, now.UnixNano())
		rows, err := s.query(ctx, `SELECT id FROM tokens WHERE id IN (?`+strings.Repeat(",?", n-1)+`) AND expires_at > ?`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ListTokens returns the unexpired tokens, of one VM when vmID is set,
// oldest first.
func (s *Store) ListTokens(ctx context.Context, vmID string, now time.Time) ([]*Token, error) {
	q, args := tokenQ.list+` WHERE expires_at>?`, []any{now.UnixNano()}
	if vmID != "" {
		q += ` AND vm_id=?`
		args = append(args, vmID)
	}
	rows, err := s.query(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, err
	}
	return scanTokens(rows)
}

// ListVMTokens lists the unexpired tokens of VM vmID and those of no VM
// (admin keys): what may act on that VM, without reading every VM's.
func (s *Store) ListVMTokens(ctx context.Context, vmID string, now time.Time) ([]*Token, error) {
	rows, err := s.query(ctx, tokenQ.list+` WHERE expires_at>? AND (vm_id=? OR (vm_id='' AND repo='')) ORDER BY created_at, id`, now.UnixNano(), vmID)
	if err != nil {
		return nil, err
	}
	return scanTokens(rows)
}

// RepoTokens lists the ids of a repository's tokens (expired ones too).
func (s *Store) RepoTokens(ctx context.Context, repo string) ([]string, error) {
	rows, err := s.query(ctx, `SELECT id FROM tokens WHERE repo=? ORDER BY id`, repo)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// DeleteToken removes a token; ErrNotFound if there is none.
func (s *Store) DeleteToken(ctx context.Context, id string) error {
	r, err := s.exec(ctx, `DELETE FROM tokens WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteTokens removes every token of a VM, and expired tokens of any VM.
func (s *Store) DeleteTokens(ctx context.Context, vmID string, now time.Time) error {
	_, err := s.exec(ctx, `DELETE FROM tokens WHERE vm_id=? OR expires_at<=?`, vmID, now.UnixNano())
	return err
}
