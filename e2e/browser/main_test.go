package browser

import (
	"os"
	"testing"

	"github.com/agentvm/agentvm/e2e/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinaries()
	os.Exit(code)
}
