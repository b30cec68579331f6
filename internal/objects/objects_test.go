package objects

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// memBucket is an in-memory Bucket that counts puts and can be told to fail.
type memBucket struct {
	mu      sync.Mutex
	objs    map[string][]byte
	puts    int
	failPut error
}

func newMem() *memBucket { return &memBucket{objs: map[string][]byte{}} }

func (m *memBucket) Put(_ context.Context, key string, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failPut != nil {
		return m.failPut
	}
	m.puts++
	m.objs[key] = append([]byte(nil), data...)
	return nil
}

func (m *memBucket) Get(_ context.Context, key string, max int64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, ErrNotFound
	}
	if int64(len(b)) > max {
		return nil, errors.New("too large")
	}
	return append([]byte(nil), b...), nil
}

func (m *memBucket) Size(_ context.Context, key string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return 0, ErrNotFound
	}
	return int64(len(b)), nil
}

func (m *memBucket) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, key)
	return nil
}

func (m *memBucket) String() string { return "mem://" }

// sample writes a file of random chunks around a run of zeros, ending in a
// partial chunk.
func sample(t *testing.T, dir, name string) (string, []byte) {
	data := make([]byte, 3*ChunkSize+12345)
	rand.Read(data[:ChunkSize])
	rand.Read(data[2*ChunkSize:])
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, data
}

func TestPutGetRoundTripAndDedupe(t *testing.T) {
	ctx, dir, b := context.Background(), t.TempDir(), newMem()
	s := New(b)
	p, data := sample(t, dir, "a")
	f, err := s.PutFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Chunks) != 4 || f.Chunks[1] != "" || f.Chunks[0] == "" || f.Size != int64(len(data)) {
		t.Fatalf("file = %d bytes, chunks %q", f.Size, f.Chunks)
	}
	if b.puts != 3 {
		t.Fatalf("puts = %d, want 3 (the zero chunk is not stored)", b.puts)
	}
	// The same bytes again, through a new Store (nothing cached), send nothing.
	if _, err := New(b).PutFile(ctx, p); err != nil || b.puts != 3 {
		t.Fatalf("second put: %v, puts = %d, want 3", err, b.puts)
	}
	// One changed chunk sends one chunk.
	data[5] ^= 0xff
	os.WriteFile(p, data, 0o600)
	f2, err := s.PutFile(ctx, p)
	if err != nil || b.puts != 4 || f2.SHA256 == f.SHA256 {
		t.Fatalf("changed put: %v, puts = %d", err, b.puts)
	}
	out := filepath.Join(dir, "out")
	if err := s.GetFile(ctx, f2, out, 1<<30); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, data) {
		t.Fatal("downloaded file differs")
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Fatal("temporary file left behind")
	}
}

func TestGetRefusesDamage(t *testing.T) {
	ctx, dir, b := context.Background(), t.TempDir(), newMem()
	s := New(b)
	p, _ := sample(t, dir, "a")
	f, err := s.PutFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	key := chunkKey(f.Chunks[2])
	good := b.objs[key]
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		name    string
		damage  func()
		file    File
		message string
	}{
		{"truncated chunk", func() { b.objs[key] = good[:len(good)/2] }, f, "is damaged"},
		{"oversized chunk", func() { b.objs[key] = make([]byte, ChunkSize+1) }, f, "too large"},
		{"altered chunk", func() { c := append([]byte(nil), good...); c[0] ^= 1; b.objs[key] = c }, f, "is damaged"},
		{"missing chunk", func() { delete(b.objs, key) }, f, "is missing"},
		{"wrong whole-file hash", func() {}, File{Size: f.Size, SHA256: strings.Repeat("0", 64), Chunks: f.Chunks}, "manifest says"},
		{"chunk count", func() {}, File{Size: f.Size, SHA256: f.SHA256, Chunks: f.Chunks[:2]}, "manifest is damaged"},
		{"short chunk hash", func() {}, File{Size: 1, SHA256: f.SHA256, Chunks: []string{"a"}}, "not a SHA-256"},
		{"path in a chunk hash", func() {}, File{Size: 1, SHA256: f.SHA256, Chunks: []string{"../../" + f.SHA256[6:]}}, "not a SHA-256"},
		{"short file hash", func() {}, File{Size: f.Size, SHA256: "ab", Chunks: f.Chunks}, "not a SHA-256"},
		{"size over the bound", func() {}, File{Size: 2 << 30, SHA256: f.SHA256, Chunks: make([]string, 512)}, "at most"},
		{"negative size", func() {}, File{Size: -1, SHA256: f.SHA256}, "-1 bytes"},
	} {
		b.objs[key] = good
		c.damage()
		err := s.GetFile(ctx, c.file, out, 1<<30)
		if err == nil || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: err = %v, want one saying %q", c.name, err, c.message)
		}
		if _, serr := os.Stat(out); !os.IsNotExist(serr) {
			t.Errorf("%s: a damaged download was left at its destination", c.name)
		}
		if _, serr := os.Stat(out + ".part"); !os.IsNotExist(serr) {
			t.Errorf("%s: temporary file left behind", c.name)
		}
	}
}

func TestPutErrorIsReported(t *testing.T) {
	ctx, dir, b := context.Background(), t.TempDir(), newMem()
	b.failPut = errors.New("503 SlowDown")
	p, _ := sample(t, dir, "a")
	if _, err := New(b).PutFile(ctx, p); err == nil || !strings.Contains(err.Error(), "SlowDown") {
		t.Fatalf("err = %v", err)
	}
	// Nothing was recorded as stored: a retry sends the chunks.
	b.failPut = nil
	if _, err := New(b).PutFile(ctx, p); err != nil || b.puts != 3 {
		t.Fatalf("retry: %v, puts = %d", err, b.puts)
	}
}

func TestManifests(t *testing.T) {
	ctx, b := context.Background(), newMem()
	s := New(b)
	type m struct{ A string }
	if err := s.GetManifest(ctx, "x", "", &m{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing manifest: %v", err)
	}
	sum, err := s.PutManifest(ctx, "x", m{"hi"})
	if err != nil {
		t.Fatal(err)
	}
	var got m
	if err := s.GetManifest(ctx, "x", sum, &got); err != nil || got.A != "hi" {
		t.Fatalf("got %+v, %v", got, err)
	}
	// Another manifest under its name (a bucket writer's) is refused.
	other, _ := s.PutManifest(ctx, "y", m{"evil"})
	b.objs["manifests/x.json"] = b.objs["manifests/y.json"]
	if err := s.GetManifest(ctx, "x", sum, &got); err == nil || !strings.Contains(err.Error(), "altered or replaced") {
		t.Fatalf("replaced manifest: %v", err)
	}
	// So is a manifest that is not JSON, even with its own hash.
	b.objs["manifests/x.json"] = []byte("{trunc")
	junk := sha256.Sum256([]byte("{trunc"))
	if err := s.GetManifest(ctx, "x", hex.EncodeToString(junk[:]), &got); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("truncated manifest: %v (%s)", err, other)
	}
	if err := s.DeleteManifest(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.GetManifest(ctx, "x", sum, &got); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted manifest: %v", err)
	}
}

func TestOpenS3Validates(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "k")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
	for _, raw := range []string{"http://b/x", "s3://", "s3://user:pw@b/x", "s3://b/x?bogus=1", "s3://b?endpoint=ftp://h", "s3://b?endpoint=http://h/path"} {
		if _, err := OpenS3(context.Background(), raw); err == nil || !strings.Contains(err.Error(), "want ") && !strings.Contains(err.Error(), "unknown parameter") {
			t.Errorf("%s: %v", raw, err)
		}
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_ACCESS_KEY", "")
	if _, err := OpenS3(context.Background(), "s3://b?endpoint=http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("no keys: %v", err)
	}
}

// A chunk truncated in the bucket is sent again by the next store of a
// file that has it, so taking a snapshot again repairs it.
func TestPutRepairsTruncatedChunk(t *testing.T) {
	ctx, dir, b := context.Background(), t.TempDir(), newMem()
	p, _ := sample(t, dir, "a")
	f, err := New(b).PutFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	key := chunkKey(f.Chunks[0])
	b.objs[key] = b.objs[key][:100]
	if _, err := New(b).PutFile(ctx, p); err != nil || b.puts != 4 || len(b.objs[key]) != ChunkSize {
		t.Fatalf("err %v, puts %d, chunk %d bytes", err, b.puts, len(b.objs[key]))
	}
	if err := New(b).GetFile(ctx, f, filepath.Join(dir, "out"), 1<<30); err != nil {
		t.Fatal(err)
	}
}
