package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"sync"
)

// idNames maps user and group ids to names and back, from the guest's
// /etc/passwd and /etc/group (under Options.Root). Immutable once loaded.
type idNames struct {
	user  map[uint32]string
	group map[uint32]string
	uid   map[string]uint32
	gid   map[string]uint32
}

type nameCache struct {
	mu    sync.Mutex
	stamp [2]fileStamp
	cur   *idNames
}

// nameCaches holds one nameCache per agent root.
var nameCaches sync.Map

// names returns the current id/name maps, reloaded when /etc/passwd or
// /etc/group changed. Call it as root (before asUser): Root may not be
// readable by the acting user.
func (a *Agent) names() *idNames {
	v, _ := nameCaches.LoadOrStore(a.opts.Root, &nameCache{})
	c := v.(*nameCache)
	passwd, group := a.path("/etc/passwd"), a.path("/etc/group")
	st := [2]fileStamp{stampOf(passwd), stampOf(group)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || st != c.stamp {
		c.cur = loadNames(passwd, group)
		c.stamp = st
	}
	return c.cur
}

func loadNames(passwd, group string) *idNames {
	n := &idNames{
		user:  map[uint32]string{},
		group: map[uint32]string{},
		uid:   map[string]uint32{},
		gid:   map[string]uint32{},
	}
	scan := func(path string, byID map[uint32]string, byName map[string]uint32) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			p := strings.SplitN(sc.Text(), ":", 4)
			if len(p) < 3 || p[0] == "" || strings.HasPrefix(p[0], "#") {
				continue
			}
			id, err := strconv.ParseUint(p[2], 10, 32)
			if err != nil {
				continue
			}
			if _, dup := byID[uint32(id)]; !dup {
				byID[uint32(id)] = p[0]
			}
			if _, dup := byName[p[0]]; !dup {
				byName[p[0]] = uint32(id)
			}
		}
	}
	scan(passwd, n.user, n.uid)
	scan(group, n.group, n.gid)
	if _, ok := n.user[0]; !ok {
		n.user[0], n.uid["root"] = "root", 0
	}
	if _, ok := n.group[0]; !ok {
		n.group[0], n.gid["root"] = "root", 0
	}
	return n
}
