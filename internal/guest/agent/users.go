package agent

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/agentvm/agentvm/internal/guest"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// userInfo is an /etc/passwd entry plus its groups.
type userInfo struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32 // primary gid first, then supplementary groups
}

// userDB caches /etc/passwd and /etc/group, reloaded when either file's
// mtime or size changes (two stats per lookup, no reads).
type userDB struct {
	root string

	mu      sync.Mutex
	stamp   [2]fileStamp
	byName  map[string]*userInfo
	byUID   map[uint32]*userInfo
	loadErr error
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{fi.ModTime(), fi.Size()}
}

// errUnknownUser: the guest has no such user (code guest.CodeUnknownUser).
var errUnknownUser = errors.New("unknown user")

// userCode is the error code of a failed user lookup.
func userCode(err error) string {
	if errors.Is(err, errUnknownUser) {
		return guest.CodeUnknownUser
	}
	return guest.CodeInvalid
}

func (d *userDB) lookup(name string) (*userInfo, error) {
	if name == "" {
		name = "root"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	passwd, group := d.root+"/etc/passwd", d.root+"/etc/group"
	st := [2]fileStamp{stampOf(passwd), stampOf(group)}
	if d.byName == nil || st != d.stamp {
		d.load(passwd, group)
		d.stamp = st
	}
	if u, ok := d.byName[name]; ok {
		return u, nil
	}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		if u, ok := d.byUID[uint32(n)]; ok {
			return u, nil
		}
		return &userInfo{Name: name, UID: uint32(n), GID: uint32(n), Home: "/", Shell: "/bin/sh", Groups: []uint32{uint32(n)}}, nil
	}
	if name == "root" {
		return &userInfo{Name: "root", Home: "/root", Shell: "/bin/sh", Groups: []uint32{0}}, nil
	}
	if d.loadErr != nil {
		return nil, fmt.Errorf("%w %q (%v)", errUnknownUser, name, d.loadErr)
	}
	return nil, fmt.Errorf("%w %q", errUnknownUser, name)
}

func (d *userDB) load(passwd, group string) {
	d.byName = map[string]*userInfo{}
	d.byUID = map[uint32]*userInfo{}
	d.loadErr = nil
	f, err := os.Open(passwd)
	if err != nil {
		d.loadErr = err
		return
	}
	defer f.Close()
	var order []*userInfo
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) < 7 || strings.HasPrefix(p[0], "#") {
			continue
		}
		uid, err1 := strconv.ParseUint(p[2], 10, 32)
		gid, err2 := strconv.ParseUint(p[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		u := &userInfo{Name: p[0], UID: uint32(uid), GID: uint32(gid), Home: p[5], Shell: p[6], Groups: []uint32{uint32(gid)}}
		if u.Home == "" {
			u.Home = "/"
		}
		if u.Shell == "" {
			u.Shell = "/bin/sh"
		}
		if _, dup := d.byName[u.Name]; !dup {
			d.byName[u.Name] = u
			order = append(order, u)
		}
		if _, dup := d.byUID[u.UID]; !dup {
			d.byUID[u.UID] = u
		}
	}
	g, err := os.Open(group)
	if err != nil {
		return
	}
	defer g.Close()
	sc = bufio.NewScanner(g)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) < 4 || p[3] == "" {
			continue
		}
		gid, err := strconv.ParseUint(p[2], 10, 32)
		if err != nil {
			continue
		}
		for _, m := range strings.Split(p[3], ",") {
			if u, ok := d.byName[strings.TrimSpace(m)]; ok && u.GID != uint32(gid) {
				u.Groups = append(u.Groups, uint32(gid))
			}
		}
	}
}
