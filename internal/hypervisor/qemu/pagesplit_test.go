package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// streamBuilder writes a synthetic migration stream the way QEMU does.
type streamBuilder struct{ bytes.Buffer }

func (b *streamBuilder) be32(v uint32) { binary.Write(b, binary.BigEndian, v) }
func (b *streamBuilder) be64(v uint64) { binary.Write(b, binary.BigEndian, v) }
func (b *streamBuilder) str(s string)  { b.WriteByte(byte(len(s))); b.WriteString(s) }

func (b *streamBuilder) header() {
	b.be32(vmFileMagic)
	b.be32(vmFileVersion)
	b.WriteByte(secConfiguration)
	b.be32(10)
	b.WriteString("pc-q35-7.2")
}

// ramStart opens the "ram" section (id 2) with a block list.
func (b *streamBuilder) ramStart(blocks ...any) {
	b.WriteByte(secStart)
	b.be32(2)
	b.str("ram")
	b.be32(0)
	b.be32(4)
	var total uint64
	for i := 0; i < len(blocks); i += 2 {
		total += uint64(blocks[i+1].(int))
	}
	b.be64(total | ramFlagMemSize)
	for i := 0; i < len(blocks); i += 2 {
		b.str(blocks[i].(string))
		b.be64(uint64(blocks[i+1].(int)))
	}
}

func (b *streamBuilder) eos() {
	b.be64(ramFlagEOS)
	b.WriteByte(secFooter)
	b.be32(2)
}

func (b *streamBuilder) part(t byte) {
	b.WriteByte(t)
	b.be32(2)
}

// page writes a PAGE record (block "" continues the last one).
func (b *streamBuilder) page(block string, addr int64, fill byte) {
	flags := uint64(ramFlagPage)
	if block == "" {
		flags |= ramFlagContinue
	}
	b.be64(uint64(addr) | flags)
	if block != "" {
		b.str(block)
	}
	b.Write(bytes.Repeat([]byte{fill}, pageSize))
}

func (b *streamBuilder) zero(block string, addr int64) {
	flags := uint64(ramFlagZero)
	if block == "" {
		flags |= ramFlagContinue
	}
	b.be64(uint64(addr) | flags)
	if block != "" {
		b.str(block)
	}
	b.WriteByte(0)
}

// devices ends the stream with a device section and the end marker.
func (b *streamBuilder) devices() {
	b.WriteByte(secFull)
	b.be32(3)
	b.str("timer")
	b.be32(0)
	b.be32(2)
	b.WriteString("opaque device state \x7e\x00")
	b.WriteByte(secEOF)
	b.WriteString("vmdesc json")
}

func split(t *testing.T, stream []byte, ramSize int64) ([]byte, *os.File, SplitStats, error) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var state bytes.Buffer
	st, err := SplitState(bytes.NewReader(stream), &state, f, ramSize)
	return state.Bytes(), f, st, err
}

func pageAt(t *testing.T, f *os.File, addr int64) []byte {
	t.Helper()
	p := make([]byte, pageSize)
	if _, err := f.ReadAt(p, addr); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSplitState(t *testing.T) {
	const ramSize = 64 * pageSize
	var in, want streamBuilder
	for _, b := range []*streamBuilder{&in, &want} {
		b.header()
		b.ramStart("mem", ramSize, "pc.bios", 4*pageSize)
		b.eos()
		b.part(secPart)
	}
	in.zero("mem", 0)
	in.page("", 1*pageSize, 0xaa)
	in.page("", 2*pageSize, 0xbb) // sent again below (a live save)
	in.page("", 3*pageSize, 0xcc) // zeroed below
	in.page("pc.bios", 0, 0x11)   // another block stays in the stream,
	in.page("", pageSize, 0x12)   // continued records too
	want.page("pc.bios", 0, 0x11)
	want.page("", pageSize, 0x12)
	in.page("mem", 10*pageSize, 0xdd)
	for _, b := range []*streamBuilder{&in, &want} {
		b.be64(ramFlagMultifdFlush)
		b.eos()
		b.part(secEnd)
	}
	in.page("mem", 2*pageSize, 0xee)
	in.zero("", 3*pageSize)
	in.zero("pc.bios", 2*pageSize)
	want.zero("pc.bios", 2*pageSize)
	for _, b := range []*streamBuilder{&in, &want} {
		b.eos()
		b.devices()
	}
	state, f, st, err := split(t, in.Bytes(), ramSize)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(state, want.Bytes()) {
		t.Fatalf("state stream:\n got %q\nwant %q", state, want.Bytes())
	}
	if st.Pages != 5 || st.ZeroPages != 2 || st.StateBytes != int64(len(state)) {
		t.Errorf("stats %+v", st)
	}
	for addr, fill := range map[int64]byte{0: 0, pageSize: 0xaa, 2 * pageSize: 0xee, 3 * pageSize: 0, 10 * pageSize: 0xdd, 11 * pageSize: 0} {
		if p := pageAt(t, f, addr); !bytes.Equal(p, bytes.Repeat([]byte{fill}, pageSize)) {
			t.Errorf("page %#x holds %#x..., want %#x", addr, p[0], fill)
		}
	}
	if fi, _ := f.Stat(); fi.Size() != ramSize {
		t.Errorf("RAM file is %d bytes, want %d", fi.Size(), ramSize)
	}
}

// TestSplitStateSparse: zero pages take no disk.
func TestSplitStateSparse(t *testing.T) {
	const ramSize = 4096 * pageSize // 16 MiB
	var in streamBuilder
	in.header()
	in.ramStart("mem", ramSize)
	in.eos()
	in.part(secEnd)
	in.page("mem", 0, 1)
	for a := int64(1); a < ramSize/pageSize; a++ {
		in.zero("", a*pageSize)
	}
	in.eos()
	in.devices()
	_, f, _, err := split(t, in.Bytes(), ramSize)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f.Name(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("RAM file of one page takes %d bytes of disk", st.Blocks*512)
	}
}

func TestSplitStateRefuses(t *testing.T) {
	const ramSize = 8 * pageSize
	good := func() *streamBuilder {
		var b streamBuilder
		b.header()
		b.ramStart("mem", ramSize)
		b.eos()
		b.part(secEnd)
		b.page("mem", 0, 1)
		return &b
	}
	cases := []struct {
		name        string
		stream      func() []byte
		unsupported bool
		msg         string
	}{
		{"not a stream", func() []byte { return []byte("hello world, not QEVM") }, true, "file header"},
		{"empty", func() []byte { return nil }, false, "ends early: inside the file header"},
		{"no end marker", func() []byte { b := good(); b.eos(); return b.Bytes() }, false, "no end marker"},
		{"truncated page", func() []byte { b := good(); return b.Bytes()[:b.Len()-100] }, false, "ends early: inside a page"},
		{"xbzrle", func() []byte { b := good(); b.be64(0x40 | ramFlagContinue); return b.Bytes() }, true, "flags"},
		// An address with the top bit set is negative as an int64: it once
		// passed the bounds check and indexed the written-pages bitmap.
		{"negative address", func() []byte {
			b := good()
			b.be64(1<<63 | ramFlagPage | ramFlagContinue)
			b.Write(make([]byte, pageSize))
			return b.Bytes()
		}, true, "a page at"},
		{"other iterative section", func() []byte {
			var b streamBuilder
			b.header()
			b.WriteByte(secStart)
			b.be32(5)
			b.str("block")
			b.be32(0)
			b.be32(1)
			return b.Bytes()
		}, true, `"block"`},
		{"device state before RAM ends", func() []byte {
			var b streamBuilder
			b.header()
			b.ramStart("mem", ramSize)
			b.eos()
			b.devices()
			return b.Bytes()
		}, true, "before the RAM section ended"},
		{"wrong RAM size", func() []byte {
			var b streamBuilder
			b.header()
			b.ramStart("mem", 2*ramSize)
			return b.Bytes()
		}, true, "main RAM block"},
		{"page past the block", func() []byte { b := good(); b.page("", ramSize, 1); return b.Bytes() }, true, "page at"},
		{"unknown block", func() []byte { b := good(); b.page("nope", 0, 1); return b.Bytes() }, true, "unknown RAM block"},
		{"continue first", func() []byte {
			var b streamBuilder
			b.header()
			b.ramStart("mem", ramSize)
			b.page("", 0, 1)
			return b.Bytes()
		}, true, "before one was named"},
		{"block list overflows", func() []byte {
			var b streamBuilder
			b.header()
			b.WriteByte(secStart)
			b.be32(2)
			b.str("ram")
			b.be64(4)
			b.be64(pageSize | ramFlagMemSize)
			b.str("mem")
			b.be64(ramSize)
			return b.Bytes()
		}, true, "listed"},
		{"nonzero fill", func() []byte { b := good(); b.be64(ramFlagZero | ramFlagContinue); b.WriteByte(7); return b.Bytes() }, true, "filled"},
		{"unknown subsection", func() []byte {
			var b streamBuilder
			b.header()
			b.WriteByte(secSubsection)
			b.str("configuration/new-thing")
			b.be32(1)
			return b.Bytes()
		}, true, "new-thing"},
		{"foreign footer", func() []byte { b := good(); b.be64(ramFlagEOS); b.WriteByte(secFooter); b.be32(9); return b.Bytes() }, true, "footer"},
		{"part of another section", func() []byte { b := good(); b.eos(); b.WriteByte(secPart); b.be32(7); return b.Bytes() }, true, "outside the RAM section"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, err := split(t, c.stream(), ramSize)
			if err == nil {
				t.Fatal("accepted")
			}
			if errors.Is(err, ErrUnsupportedStream) != c.unsupported || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q (unsupported: %v), want one saying %q (unsupported: %v)", err, errors.Is(err, ErrUnsupportedStream), c.msg, c.unsupported)
			}
		})
	}
}

func TestStateInfo(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "old")
	os.WriteFile(stream, []byte("QEVM\x00\x00\x00\x03rest"), 0o600)
	if info, err := ReadStateInfo(stream); err != nil || info.Format != FormatStream {
		t.Fatalf("stream state: %+v %v", info, err)
	}
	pages := filepath.Join(dir, "new")
	os.WriteFile(pages, append(pagesHeader(1<<20, SplitStats{InjectAt: 100, RAMSection: 3, Footers: true}), "QEVM"...), 0o600)
	if _, err := ReadStateInfo(pages); err == nil || !strings.Contains(err.Error(), "RAM file is gone") {
		t.Fatalf("state without its RAM file: %v", err)
	}
	os.WriteFile(pages+RAMSuffix, nil, 0o600)
	os.Truncate(pages+RAMSuffix, 1<<20)
	info, err := ReadStateInfo(pages)
	if err != nil || info.Format != FormatPages || info.RAMSize != 1<<20 || info.Offset != pagesHeaderLen || info.RAMPath != pages+RAMSuffix ||
		info.InjectAt != 100 || info.RAMSection != 3 || !info.Footers {
		t.Fatalf("page state: %+v %v", info, err)
	}
	os.Truncate(pages+RAMSuffix, 4096)
	if _, err := ReadStateInfo(pages); err == nil {
		t.Fatal("RAM file of the wrong size accepted")
	}
	// QEMU's mapped-ram file is a stream whose configuration names the
	// capability (after the page bits, before the uuid).
	for _, tc := range []struct {
		caps []string
		want string
	}{{nil, FormatStream}, {[]string{"x-ignore-shared"}, FormatStream}, {[]string{"x-ignore-shared", "mapped-ram"}, FormatMapped}} {
		var b streamBuilder
		b.header()
		b.WriteByte(secSubsection)
		b.str("configuration/target-page-bits")
		b.be32(1)
		b.be32(12)
		if tc.caps != nil {
			b.WriteByte(secSubsection)
			b.str("configuration/capabilities")
			b.be32(1)
			b.be32(uint32(len(tc.caps)))
			for _, c := range tc.caps {
				b.str(c)
			}
		}
		capsEnd := b.Len()
		b.WriteByte(secSubsection)
		b.str("configuration/uuid")
		b.be32(1)
		b.Write(make([]byte, 16))
		p := filepath.Join(dir, "mapped")
		os.WriteFile(p, b.Bytes(), 0o600)
		if info, err := ReadStateInfo(p); err != nil || info.Format != tc.want {
			t.Errorf("capabilities %v: %+v %v, want %s", tc.caps, info, err, tc.want)
		}
		// Cut before its capabilities end, it is a stream QEMU will
		// refuse, never an error here.
		for n := 4; n < b.Len(); n += 7 {
			os.WriteFile(p, b.Bytes()[:n], 0o600)
			want := FormatStream
			if n >= capsEnd {
				want = tc.want
			}
			if info, err := ReadStateInfo(p); err != nil || info.Format != want {
				t.Fatalf("capabilities %v cut at %d: %+v %v", tc.caps, n, info, err)
			}
		}
	}
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("AVMPAGE"), 0o600)
	if _, err := ReadStateInfo(garbage); err == nil {
		t.Fatal("garbage accepted")
	}
	// RenameState moves the RAM file with the state, and drops a stale one.
	os.Truncate(pages+RAMSuffix, 1<<20)
	if err := RenameState(pages, filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadStateInfo(filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(stream+"2", []byte("QEVM"), 0o600)
	if err := RenameState(stream+"2", filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "moved") + RAMSuffix); !os.IsNotExist(err) {
		t.Fatalf("stale RAM file kept: %v", err)
	}
}

func FuzzSplitState(f *testing.F) {
	var b streamBuilder
	b.header()
	b.ramStart("mem", 4*pageSize, "x", pageSize)
	b.eos()
	b.part(secEnd)
	b.page("mem", pageSize, 3)
	b.zero("x", 0)
	b.eos()
	b.devices()
	f.Add(b.Bytes())
	f.Add([]byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00\x01x\x05\x1aconfiguration/capabilities\x00\x00\x00\x01\x00\x00\x00\x01\x0ex-ignore-shared"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		ram, err := os.CreateTemp(dir, "ram")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(ram.Name())
		defer ram.Close()
		var state bytes.Buffer
		st, err := SplitState(bytes.NewReader(data), &state, ram, 4*pageSize)
		if err == nil && st.StateBytes != int64(state.Len()) {
			t.Fatalf("stats say %d state bytes, wrote %d", st.StateBytes, state.Len())
		}
		if fi, _ := ram.Stat(); fi.Size() != 4*pageSize {
			t.Fatalf("RAM file is %d bytes", fi.Size())
		}
	})
}

// fullDisk is a RAM file on a full disk.
type fullDisk struct{}

func (fullDisk) WriteAt(p []byte, off int64) (int, error) { return 0, unix.ENOSPC }
func (fullDisk) Truncate(int64) error                     { return nil }

func TestSplitStateWriteError(t *testing.T) {
	var b streamBuilder
	b.header()
	b.ramStart("mem", 4*pageSize)
	b.eos()
	b.part(secEnd)
	b.page("mem", 0, 1)
	b.eos()
	b.devices()
	_, err := SplitState(bytes.NewReader(b.Bytes()), &bytes.Buffer{}, fullDisk{}, 4*pageSize)
	if !errors.Is(err, unix.ENOSPC) || errors.Is(err, ErrUnsupportedStream) || errors.Is(err, errTruncated) {
		t.Fatalf("write error: %v", err)
	}
}

// BenchmarkSplitState: a 1 GiB guest with every fourth page in use.
func BenchmarkSplitState(b *testing.B) {
	const ramSize = 1 << 30
	var in streamBuilder
	in.header()
	in.ramStart("mem", ramSize)
	in.eos()
	in.part(secEnd)
	for a := int64(0); a < ramSize; a += pageSize {
		block := ""
		if a == 0 {
			block = "mem"
		}
		if a/pageSize%4 == 0 {
			in.page(block, a, byte(a/pageSize))
		} else {
			in.zero(block, a)
		}
	}
	in.eos()
	in.devices()
	stream := in.Bytes()
	dir := b.TempDir()
	b.SetBytes(int64(len(stream)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Create(filepath.Join(dir, "ram"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := SplitState(bytes.NewReader(stream), io.Discard, f, ramSize); err != nil {
			b.Fatal(err)
		}
		f.Close()
		os.Remove(f.Name())
	}
}

// TestWriteEager: a page-format state streamed back whole (a wake into
// anonymous memory) is the state's stream with the main block's non-zero
// pages as one more part of the RAM section, right after its start; split
// again, it gives the same state and the same RAM.
func TestWriteEager(t *testing.T) {
	const ramSize = 64 * pageSize
	var in, want streamBuilder
	for _, b := range []*streamBuilder{&in, &want} {
		b.header()
		b.ramStart("mem", ramSize, "pc.bios", 4*pageSize)
		b.eos()
	}
	want.part(secPart)
	want.page("mem", 1*pageSize, 0xaa)
	want.page("", 10*pageSize, 0xdd)
	want.page("", 63*pageSize, 0xee)
	want.eos()
	for _, b := range []*streamBuilder{&in, &want} {
		b.part(secPart)
	}
	in.zero("mem", 0)
	in.page("", 1*pageSize, 0xaa)
	in.page("", 3*pageSize, 0xcc)
	in.page("pc.bios", 0, 0x11)
	want.page("pc.bios", 0, 0x11)
	in.page("mem", 10*pageSize, 0xdd)
	in.page("", 63*pageSize, 0xee)
	for _, b := range []*streamBuilder{&in, &want} {
		b.eos()
		b.part(secEnd)
	}
	in.zero("mem", 3*pageSize) // written, then zero: a hole again
	for _, b := range []*streamBuilder{&in, &want} {
		b.eos()
		b.devices()
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	ram, err := os.Create(path + RAMSuffix)
	if err != nil {
		t.Fatal(err)
	}
	var state bytes.Buffer
	st, err := SplitState(bytes.NewReader(in.Bytes()), &state, ram, ramSize)
	ram.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st.InjectAt <= 0 || st.RAMSection != 2 || !st.Footers {
		t.Fatalf("stats %+v", st)
	}
	os.WriteFile(path, append(pagesHeader(ramSize, st), state.Bytes()...), 0o600)
	var eager bytes.Buffer
	if err := writeEager(&eager, path); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(eager.Bytes(), want.Bytes()) {
		t.Fatalf("eager stream:\n got %q\nwant %q", eager.Bytes(), want.Bytes())
	}
	state2, f2, _, err := split(t, eager.Bytes(), ramSize)
	if err != nil {
		t.Fatalf("the eager stream does not split again: %v", err)
	}
	var empty streamBuilder // the injected part, without its pages
	empty.part(secPart)
	empty.eos()
	again := append(append(append([]byte{}, state.Bytes()[:st.InjectAt]...), empty.Bytes()...), state.Bytes()[st.InjectAt:]...)
	if !bytes.Equal(state2, again) {
		t.Fatalf("split again, the eager stream gives another state:\n got %q\nwant %q", state2, again)
	}
	for addr := int64(0); addr < ramSize; addr += pageSize {
		a, _ := os.ReadFile(path + RAMSuffix)
		if !bytes.Equal(a[addr:addr+pageSize], pageAt(t, f2, addr)) {
			t.Fatalf("page %#x differs after the round trip", addr)
		}
	}

	// A state that does not say where its pages go, or a stream state, is refused.
	os.WriteFile(path, append(pagesHeader(ramSize, SplitStats{}), state.Bytes()...), 0o600)
	if err := writeEager(io.Discard, path); err == nil {
		t.Fatal("a state without its injection point streamed")
	}
	os.WriteFile(path, in.Bytes(), 0o600)
	if err := writeEager(io.Discard, path); err == nil {
		t.Fatal("a stream-format state streamed as a page-format one")
	}
}
