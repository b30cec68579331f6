package agent

import (
	"bytes"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// File metadata: small key/value pairs kept as extended attributes
// user.e2b.<key> (the E2B SDK's file metadata), written with a file
// (PUT /v1/files?meta=key=value) and returned by stat and list.

const (
	metaPrefix   = "user.e2b."
	maxMetaKeys  = 32
	maxMetaValue = 1024
	maxMetaTotal = 3 << 10 // ext4 keeps a file's attributes in one block
)

// metaKeyRe is an HTTP header token (the SDK sends metadata as headers),
// lowercased.
var metaKeyRe = regexp.MustCompile("^[a-z0-9!#$%&'*+.^_`|~-]{1,128}$")

// parseMeta reads meta=key=value parameters.
func parseMeta(params []string) (map[string]string, error) {
	if len(params) == 0 {
		return nil, nil
	}
	if len(params) > maxMetaKeys {
		return nil, errInvalid("at most %d metadata entries", maxMetaKeys)
	}
	out := make(map[string]string, len(params))
	total := 0
	for _, p := range params {
		k, v, ok := strings.Cut(p, "=")
		k = strings.ToLower(k)
		if !ok || !metaKeyRe.MatchString(k) {
			return nil, errInvalid("bad metadata %q: want key=value with a header-token key", p)
		}
		if len(v) > maxMetaValue || strings.ContainsAny(v, "\x00\r\n") {
			return nil, errInvalid("metadata %q: the value must be at most %d bytes of one line", k, maxMetaValue)
		}
		out[k] = v
		if total += len(k) + len(v); total > maxMetaTotal {
			return nil, errInvalid("metadata larger than %d bytes in all", maxMetaTotal)
		}
	}
	return out, nil
}

// setMeta writes metadata on an open file, in place of what it had: a
// write replaces a file's metadata (an in-place write keeps the inode, and
// with it the attributes of the content it replaces).
func setMeta(fd int, meta map[string]string) error {
	if size, err := unix.Flistxattr(fd, nil); err == nil && size > 0 {
		buf := make([]byte, size+256)
		if n, err := unix.Flistxattr(fd, buf); err == nil {
			for _, name := range bytes.Split(buf[:n], []byte{0}) {
				if key, ok := strings.CutPrefix(string(name), metaPrefix); ok && key != "" {
					if _, keep := meta[key]; !keep {
						if err := unix.Fremovexattr(fd, string(name)); err != nil && err != unix.ENODATA {
							return err
						}
					}
				}
			}
		}
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, metaPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// readMeta reads a path's metadata (without following a symlink); nil when
// it has none or the file system keeps no user attributes.
func readMeta(path string) map[string]string {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		return nil
	}
	buf := make([]byte, min(size+256, 64<<10)) // room for one added meanwhile
	n, err := unix.Llistxattr(path, buf)
	if err != nil || n == 0 {
		return nil
	}
	var out map[string]string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		key, ok := strings.CutPrefix(string(name), metaPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, maxMetaValue)
		m, err := unix.Lgetxattr(path, string(name), val)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:m])
	}
	return out
}
