// Package objects keeps files in an object store (an S3 bucket, see OpenS3)
// as content-addressed chunks, so that a saved VM state (memory and disk
// layers) taken on one node can be restored on another. A file is cut into
// ChunkSize pieces, each stored once under the SHA-256 of its bytes (a chunk
// that is already there, such as a template's unchanged disk, is never sent
// again; an all-zero chunk is not stored at all); a manifest, written last,
// names a state's files and their chunks. A download checks every chunk and
// every whole file against its hash, so a truncated or altered object is an
// error, never a state.
package objects

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// ChunkSize is the size of every chunk but a file's last.
const ChunkSize = 4 << 20

// ErrNotFound is returned for an object the bucket does not have.
var ErrNotFound = errors.New("no such object")

// Bucket is where objects live: an S3 bucket under a prefix (OpenS3), or a
// fake in tests. Keys are relative to the prefix.
type Bucket interface {
	Put(ctx context.Context, key string, data []byte) error
	// Get reads an object of at most max bytes (a larger one is an
	// error); ErrNotFound if there is none.
	Get(ctx context.Context, key string, max int64) ([]byte, error)
	// Size is the size of an object; ErrNotFound if there is none.
	Size(ctx context.Context, key string) (int64, error)
	Delete(ctx context.Context, key string) error // no error for a missing key
	String() string                               // for messages, e.g. "s3://bucket/prefix"
}

// File is one stored file: its size, the SHA-256 of its bytes and of each
// chunk ("" for a chunk of zeros).
type File struct {
	Size   int64    `json:"size"`
	SHA256 string   `json:"sha256"`
	Chunks []string `json:"chunks"`
}

// Store stores files and manifests in a bucket.
type Store struct {
	b Bucket
	// Parallel is how many chunks move at once (4 when 0).
	Parallel int

	mu   sync.Mutex
	have map[string]bool // chunks known to be in the bucket
}

// New returns a Store on b.
func New(b Bucket) *Store { return &Store{b: b, have: map[string]bool{}} }

// String names the store's bucket.
func (s *Store) String() string { return s.b.String() }

func chunkKey(sum string) string { return "chunks/" + sum[:2] + "/" + sum }

func (s *Store) parallel() int {
	if s.Parallel > 0 {
		return s.Parallel
	}
	return 4
}

// PutFile stores the file at p and returns its description; chunks the
// bucket already has are not sent.
func (s *Store) PutFile(ctx context.Context, p string) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	var (
		out     File
		whole   = sha256.New()
		readErr error
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel())
	for gctx.Err() == nil {
		buf := make([]byte, ChunkSize)
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			buf = buf[:n]
			whole.Write(buf)
			out.Size += int64(n)
			if isZero(buf) {
				out.Chunks = append(out.Chunks, "")
			} else {
				sum := sha256.Sum256(buf)
				h := hex.EncodeToString(sum[:])
				out.Chunks = append(out.Chunks, h)
				g.Go(func() error {
					if err := s.putChunk(gctx, h, buf); err != nil {
						return fmt.Errorf("store %s: %w", p, err)
					}
					return nil
				})
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("read %s: %w", p, err)
			break
		}
	}
	if err := g.Wait(); err != nil {
		return File{}, err
	}
	if readErr != nil {
		return File{}, readErr
	}
	if err := ctx.Err(); err != nil {
		return File{}, err
	}
	out.SHA256 = hex.EncodeToString(whole.Sum(nil))
	return out, nil
}

func (s *Store) putChunk(ctx context.Context, h string, data []byte) error {
	s.mu.Lock()
	known := s.have[h]
	s.mu.Unlock()
	if known {
		return nil
	}
	key := chunkKey(h)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// A chunk of another size than its bytes' (truncated in the bucket)
	// is sent again; its content is checked by every fetch.
	size, err := s.b.Size(ctx, key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if err != nil || size != int64(len(data)) {
		if err := s.b.Put(ctx, key, data); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.have[h] = true
	s.mu.Unlock()
	return nil
}

// Check says what is wrong with f as a manifest describes it, if anything:
// hashes that are not SHA-256 in hex, a size over max, or a list of chunks
// that does not fit the size. A manifest comes from outside (whoever can
// write the bucket): it is checked before any of it names a key or a file.
func (f File) Check(max int64) error {
	if !isSHA256(f.SHA256) {
		return fmt.Errorf("file hash %.80q is not a SHA-256", f.SHA256)
	}
	if f.Size < 0 || f.Size > max {
		return fmt.Errorf("a file of %d bytes (at most %d expected)", f.Size, max)
	}
	if int64(len(f.Chunks)) != (f.Size+ChunkSize-1)/ChunkSize {
		return fmt.Errorf("a file of %d bytes cannot have %d chunks", f.Size, len(f.Chunks))
	}
	for _, c := range f.Chunks {
		if c != "" && !isSHA256(c) {
			return fmt.Errorf("chunk hash %.80q is not a SHA-256", c)
		}
	}
	return nil
}

func isSHA256(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// GetFile writes the stored file f to dst (through a temporary file that
// is renamed into place once every byte checked out); f must be no larger
// than max. Chunks of zeros are left as holes.
func (s *Store) GetFile(ctx context.Context, f File, dst string, max int64) error {
	if err := f.Check(max); err != nil {
		return fmt.Errorf("object store %s: the manifest is damaged: %v", s.b, err)
	}
	tmp := dst + ".part"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			out.Close()
			os.Remove(tmp)
		}
	}()
	if err := out.Truncate(f.Size); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.parallel())
	for i, h := range f.Chunks {
		if h == "" {
			continue
		}
		if gctx.Err() != nil {
			break
		}
		want := int64(ChunkSize)
		if rest := f.Size - int64(i)*ChunkSize; rest < want {
			want = rest
		}
		g.Go(func() error { return s.getChunk(gctx, h, want, out, int64(i)*ChunkSize) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The whole file is hashed once more: the manifest's list of chunks
	// is checked, not only each chunk.
	in, err := os.Open(tmp)
	if err != nil {
		return err
	}
	whole := sha256.New()
	_, err = io.Copy(whole, in)
	in.Close()
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(whole.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("object store %s: the file put together from its chunks has SHA-256 %s, its manifest says %s", s.b, got, f.SHA256)
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	ok = true
	return os.Rename(tmp, dst)
}

// opTimeout bounds one object's transfer: a stalled connection fails the
// operation (which is retried) instead of holding it forever.
const opTimeout = 5 * time.Minute

func (s *Store) getChunk(ctx context.Context, h string, want int64, out *os.File, off int64) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	data, err := s.b.Get(ctx, chunkKey(h), ChunkSize)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("object store %s: chunk %s is missing", s.b, h)
	}
	if err != nil {
		return fmt.Errorf("object store %s: chunk %s: %w", s.b, h, err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != h || int64(len(data)) != want {
		return fmt.Errorf("object store %s: chunk %s is damaged (%d bytes with SHA-256 %s, want %d bytes)", s.b, h, len(data), got, want)
	}
	_, err = out.WriteAt(data, off)
	return err
}

func isZero(b []byte) bool {
	var zero [4096]byte
	for len(b) > 0 {
		n := min(len(b), len(zero))
		if !bytes.Equal(b[:n], zero[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// maxManifest bounds a manifest: one of a 1 TiB state names 256 Ki chunks.
const maxManifest = 64 << 20

func manifestKey(name string) string { return path.Join("manifests", name+".json") }

// ManifestSum is the SHA-256 PutManifest gives v, for a caller that names
// the manifest by it.
func ManifestSum(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// PutManifest stores v (JSON) as the manifest called name and returns its
// SHA-256, which GetManifest checks: keep it where the bucket's writers
// cannot change it. Put a manifest after the files it names: it is the
// mark of a complete state.
func (s *Store) PutManifest(ctx context.Context, name string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), s.b.Put(ctx, manifestKey(name), b)
}

// GetManifest reads the manifest called name, whose SHA-256 must be want,
// into v.
func (s *Store) GetManifest(ctx context.Context, name, want string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	b, err := s.b.Get(ctx, manifestKey(name), maxManifest)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("object store %s has no manifest %s: %w", s.b, name, err)
	}
	if err != nil {
		return fmt.Errorf("object store %s: manifest %s: %w", s.b, name, err)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != want {
		return fmt.Errorf("object store %s: manifest %s is not the one that was stored (SHA-256 %x, want %s): it was altered or replaced", s.b, name, sum, want)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("object store %s: manifest %s is damaged: %v", s.b, name, err)
	}
	return nil
}

// DeleteManifest removes the manifest called name. The chunks stay: others
// may share them.
func (s *Store) DeleteManifest(ctx context.Context, name string) error {
	return s.b.Delete(ctx, manifestKey(name))
}
