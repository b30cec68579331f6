package qemu

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// FormatMapped is QEMU's own page-for-page state file (the mapped-ram
// migration capability, QEMU 9.0 and later): QEMU writes each RAM page at
// its own offset in one sparse file, zero pages as holes, and a restore
// reads only the pages the file holds, in place, into fresh anonymous
// memory. Its cost follows the guest's data, not its size, and the
// restored VM's next save reads untouched memory as cheaply as a VM that
// never was restored (unlike a mapped RAM file, see bench/RESULTS.md).
// Suspends use it with serve --state-format mapped-ram; a QEMU before 9.0
// saves a stream instead.
const FormatMapped = "mapped-ram"

// mappedRAMMajor.mappedRAMMinor is the first QEMU with the mapped-ram capability.
const mappedRAMMajor, mappedRAMMinor = 9, 0

// MappedRAM reports whether this QEMU can save and restore FormatMapped.
func (m *Machine) MappedRAM(ctx context.Context) bool {
	v, err := m.Version(ctx)
	return err == nil && atLeast(v, mappedRAMMajor, mappedRAMMinor)
}

// setMappedRAM sets the mapped-ram capability, and with multifd on (a
// save's) the multifd capability with one channel: QEMU's mapped-ram writer
// without multifd makes one pwrite per 4 KiB page, and a suspend of a 1 GiB
// VM holding 500 MiB took 1.0-1.4 s that way against 0.55-0.7 s with one
// multifd channel (two were no faster on two cores). A restore reads
// without multifd: its receiving threads spun on a free channel. A QEMU
// without mapped-ram is only ever asked to turn it off, which is then a
// no-op.
func (m *Machine) setMappedRAM(ctx context.Context, on, multifd bool) error {
	if !on && !m.MappedRAM(ctx) {
		return nil
	}
	if multifd {
		if _, err := m.qmp.Execute(ctx, "migrate-set-parameters", map[string]any{"multifd-channels": 1}); err != nil {
			return err
		}
	}
	_, err := m.qmp.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "mapped-ram", "state": on}, {"capability": "multifd", "state": on && multifd}}})
	return err
}

// fileChannel names a file as a migration's main channel: the structured
// form of the "file:" URI, in which the path is not parsed (the URI takes
// ",offset=N" after it).
func fileChannel(path string) []map[string]any {
	return []map[string]any{{"channel-type": "main", "addr": map[string]any{"transport": "file", "filename": path, "offset": 0}}}
}

// streamCapabilities reads the migration capabilities a QEMU stream records
// in its configuration section (QEMU records those a restore must match:
// x-ignore-shared and mapped-ram). A stream without that section, or whose
// section this reader does not know, records none it can tell.
func streamCapabilities(r io.Reader) ([]string, error) {
	br := bufio.NewReaderSize(r, 4096)
	var hdr [9]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, err
	}
	if string(hdr[:4]) != "QEVM" {
		return nil, errors.New("not a migration stream")
	}
	if hdr[8] != secConfiguration {
		return nil, nil
	}
	be32 := func() (uint32, error) {
		var b [4]byte
		_, err := io.ReadFull(br, b[:])
		return binary.BigEndian.Uint32(b[:]), err
	}
	str := func() (string, error) {
		n, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(br, b)
		return string(b), err
	}
	n, err := be32() // the machine type's name
	if err != nil {
		return nil, err
	}
	if n > 256 {
		return nil, fmt.Errorf("machine type name of %d bytes", n)
	}
	if _, err := br.Discard(int(n)); err != nil {
		return nil, err
	}
	for {
		t, err := br.ReadByte()
		if err != nil || t != secSubsection {
			return nil, err
		}
		name, err := str()
		if err != nil {
			return nil, err
		}
		if _, err := be32(); err != nil { // its version
			return nil, err
		}
		switch name {
		case "configuration/target-page-bits":
			if _, err := be32(); err != nil {
				return nil, err
			}
		case "configuration/capabilities":
			count, err := be32()
			if err != nil {
				return nil, err
			}
			if count > 64 {
				return nil, fmt.Errorf("%d capabilities", count)
			}
			caps := make([]string, 0, count)
			for i := uint32(0); i < count; i++ {
				c, err := str()
				if err != nil {
					return nil, err
				}
				caps = append(caps, c)
			}
			return caps, nil
		default:
			return nil, nil // capabilities come before the others QEMU knows
		}
	}
}
