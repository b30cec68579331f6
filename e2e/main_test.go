package e2e

import (
	"os"
	"testing"

	"github.com/agentvm/agentvm/e2e/testenv"
)

// Every test here calls t.Parallel first: each starts its own servers, with
// their own data dirs, ports and VM names, and shares only the image and
// template caches (built under a file lock). scripts/test.sh runs them two
// at a time (-parallel), which fills the time one test spends waiting on its
// guest with another's work. A new test must keep to that: no fixed ports or
// names on the host, no t.Setenv, nothing host-wide it does not own.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinaries()
	os.Exit(code)
}
