package docs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/agentvm/agentvm/"

// TestArchitecturePackages: the package diagram in ARCHITECTURE.md (its
// ```imports block) is go list's: every package of the module on one line
// with exactly the module's packages it imports (those its tests import, for
// a package of tests only), and every import points to a line further down,
// so the diagram reads top to bottom as the layering it claims.
func TestArchitecturePackages(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc, order, err := parseImportsBlock(string(b))
	if err != nil {
		t.Fatal(err)
	}
	real := goListImports(t)
	for _, p := range order {
		want, ok := real[p]
		if !ok {
			t.Errorf("ARCHITECTURE.md names package %s, which go list does not know", p)
			continue
		}
		if got := doc[p]; !slices.Equal(got, want) {
			t.Errorf("ARCHITECTURE.md: %s imports %v, go list says %v", p, got, want)
		}
		at := slices.Index(order, p)
		for _, d := range doc[p] {
			if i := slices.Index(order, d); i >= 0 && i <= at {
				t.Errorf("ARCHITECTURE.md: %s imports %s, which is drawn above it (imports point down)", p, d)
			}
		}
	}
	for p := range real {
		if _, ok := doc[p]; !ok {
			t.Errorf("ARCHITECTURE.md's diagram misses package %s (imports %v)", p, real[p])
		}
	}
	if t.Failed() {
		t.Logf("go list's graph, to redraw from:\n%s", formatImports(real))
	}
}

// parseImportsBlock reads the ```imports block: lines "pkg ─> dep dep ...",
// or "pkg" alone; names are module paths without "internal/"; "#" starts a
// comment.
func parseImportsBlock(md string) (map[string][]string, []string, error) {
	doc := map[string][]string{}
	var order []string
	in, found := false, false
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```imports":
			in, found = true, true
			continue
		case in && strings.TrimSpace(line) == "```":
			in = false
			continue
		case !in:
			continue
		}
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		lhs, rhs, _ := strings.Cut(line, "─>")
		p := strings.TrimSpace(lhs)
		if strings.ContainsAny(p, " \t") {
			return nil, nil, fmt.Errorf("ARCHITECTURE.md:%d: %q: one package before ─>", n, line)
		}
		if _, dup := doc[p]; dup {
			return nil, nil, fmt.Errorf("ARCHITECTURE.md:%d: %s drawn twice", n, p)
		}
		deps := strings.Fields(rhs)
		slices.Sort(deps)
		doc[p] = deps
		order = append(order, p)
	}
	if !found || in {
		return nil, nil, fmt.Errorf("ARCHITECTURE.md has no closed ```imports block")
	}
	return doc, order, nil
}

// goListImports is each package's imports within the module (test imports
// for a package that has only tests), named as the diagram names them.
func goListImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,GoFiles,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	real := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath                         string
			GoFiles                            []string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		imports := p.Imports
		if len(p.GoFiles) == 0 {
			imports = append(p.TestImports, p.XTestImports...)
		}
		name := short(p.ImportPath)
		deps := []string{}
		for _, im := range imports {
			if strings.HasPrefix(im, module) && short(im) != name && !slices.Contains(deps, short(im)) {
				deps = append(deps, short(im))
			}
		}
		slices.Sort(deps)
		real[name] = deps
	}
	return real
}

func short(importPath string) string {
	return strings.TrimPrefix(strings.TrimPrefix(importPath, module), "internal/")
}

func formatImports(real map[string][]string) string {
	var sb strings.Builder
	names := make([]string, 0, len(real))
	for p := range real {
		names = append(names, p)
	}
	slices.Sort(names)
	for _, p := range names {
		if len(real[p]) == 0 {
			fmt.Fprintf(&sb, "%s\n", p)
		} else {
			fmt.Fprintf(&sb, "%-20s ─> %s\n", p, strings.Join(real[p], " "))
		}
	}
	return sb.String()
}
