package codeinterp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every runtime file of this directory must be installed: server.py imports
// its sibling modules from its own directory.
func TestFilesListsEveryRuntimeFile(t *testing.T) {
	got := Files()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, e := range entries {
		n := e.Name()
		ext := filepath.Ext(n)
		if e.IsDir() || (ext != ".py" && ext != ".js" && ext != ".java") || strings.HasPrefix(n, "test_") {
			continue
		}
		want[n] = true
		if _, ok := got[n]; !ok {
			t.Errorf("%s is not in Files() (add it to names and the go:embed line)", n)
		}
	}
	for n, content := range got {
		if !want[n] {
			t.Errorf("Files() has %s, which is not a runtime file here", n)
		}
		if content == "" {
			t.Errorf("%s is empty", n)
		}
	}
}
