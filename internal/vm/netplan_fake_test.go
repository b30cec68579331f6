package vm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// A data dir holds more than 256 VMs (issue 35): past the first 256
// networks (10.200.0.0/16, which VMs made before keep) a VM gets a
// subnet of 10.201.0.0/16 and on, and runs there; past the last one a
// create is refused, saying why.
func TestAddressPlanPast256(t *testing.T) {
	e := newFakeEnv(t)
	// 300 VMs the store holds (stopped: their networks are taken all the same).
	for i := 1; i <= 300; i++ {
		v := &store.VM{ID: fmt.Sprintf("vm-%012x", i), Name: fmt.Sprintf("old-%d", i), State: store.StateStopped,
			CPUs: 1, MemoryMiB: 128, NetIndex: i, MachineID: randHex(16), CreatedAt: time.Now().UTC()}
		if err := e.st.CreateVM(e.ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	v := e.create("past-256")
	if v.NetIndex != 301 {
		t.Fatalf("net index %d, want 301", v.NetIndex)
	}
	c := e.s.nets.config(v.NetIndex)
	if c.GuestIP().String() != "10.201.45.2" || c.Gateway().String() != "10.201.45.1" {
		t.Fatalf("guest %v gateway %v, want 10.201.45.2 and .1", c.GuestIP(), c.Gateway())
	}
	if out := e.exec("past-256", "echo up"); strings.TrimSpace(out) != "up" {
		t.Fatalf("exec: %q", out)
	}
	if n := e.s.instance(v.ID).net; n == nil || n.Config().Subnet.String() != "10.201.45.0/24" {
		t.Fatalf("the VM's running network is not its subnet: %+v", n)
	}

	// Every network in use: refused with the reason, and no row is left.
	full := newFakeEnvOn(t, e.st, filepath.Join(t.TempDir(), "full"), func(f *fakeEnv) {
		f.vst = fullNets{e.st}
	})
	_, _, err := full.s.Create(full.ctx, CreateOptions{Name: "one-too-many", MemoryMiB: 512})
	if !errors.Is(err, ErrInsufficient) || !strings.Contains(err.Error(), fmt.Sprint(network.MaxSubnetIndex)) {
		t.Fatalf("create past the last network: %v", err)
	}
	if _, err := e.st.GetVM(e.ctx, "one-too-many"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused create left a row: %v", err)
	}
}

// fullNets is a store whose VM networks are all in use.
type fullNets struct{ *store.Store }

func (fullNets) FreeNetIndex(context.Context) (int, error) {
	return network.MaxSubnetIndex + 1, nil
}
