package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../.."

var (
	ticked = regexp.MustCompile("`([^`\n]+)`")
	// A Go name as a document cites it: Name, pkg.Name, Type.Method().
	goName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$`)
	// A repository path: segments of path characters with a slash or a
	// file extension, and nothing that stands for something else.
	repoPath = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$`)
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// codeSpan is inline code; htmlAnchor an explicit anchor (<a id="x"></a>).
	codeSpan   = regexp.MustCompile("`[^`]*`")
	htmlAnchor = regexp.MustCompile(`<a id="([^"]+)"></a>`)
)

// words is every identifier-like word in the repository's Go sources and
// scripts: what a document may cite by name.
func words(t *testing.T) (map[string]bool, map[string]bool) {
	t.Helper()
	w, base := map[string]bool{}, map[string]bool{}
	word := regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "dist":
				return filepath.SkipDir
			}
			return nil
		}
		base[d.Name()] = true
		switch filepath.Ext(p) {
		case ".go", ".sh", ".py", ".ts", ".tsx", ".mjs", ".yaml", ".sql":
		default:
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range word.FindAll(b, -1) {
			w[string(m)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, base
}

// TestArchitectureNames: every Go name and repository path that
// ARCHITECTURE.md cites in backticks exists.
func TestArchitectureNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	known, files := words(t)
	for i, line := range bytes.Split(b, []byte("\n")) {
		for _, m := range ticked.FindAllSubmatch(line, -1) {
			tok := string(m[1])
			switch {
			case strings.HasSuffix(tok, ".go") && !strings.Contains(tok, "/"):
				if !files[tok] {
					t.Errorf("ARCHITECTURE.md:%d: `%s`: no Go file of that name", i+1, tok)
				}
			case strings.Contains(tok, "/"):
				// A path in the repository (not a host, guest or URL path).
				if repoPath.MatchString(tok) && looksLikeRepoPath(tok) {
					if _, err := os.Stat(filepath.Join(root, tok)); err != nil {
						t.Errorf("ARCHITECTURE.md:%d: `%s`: no such file or directory", i+1, tok)
					}
				}
			case goName.MatchString(tok):
				for _, part := range strings.Split(strings.TrimSuffix(tok, "()"), ".") {
					if !known[part] {
						t.Errorf("ARCHITECTURE.md:%d: `%s`: %q is named nowhere in the code", i+1, tok, part)
						break
					}
				}
			}
		}
	}
}

// looksLikeRepoPath: a path that starts with one of the repository's own
// top-level entries (not a guest or host path such as run/agentvm/...).
func looksLikeRepoPath(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	_, err := os.Stat(filepath.Join(root, first))
	return err == nil
}

// TestDocLinks: every relative link in README.md, ARCHITECTURE.md and
// docs/*.md leads to a file or directory of the repository.
func TestDocLinks(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "ARCHITECTURE.md"), filepath.Join(root, "bench", "RESULTS.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A page with explicit anchors (the generated API reference)
		// has its in-page links checked against them.
		anchors := map[string]bool{}
		for _, m := range htmlAnchor.FindAllSubmatch(b, -1) {
			anchors[string(m[1])] = true
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			line = codeSpan.ReplaceAll(line, nil) // `a](b)` in code is not a link
			for _, m := range mdLink.FindAllSubmatch(line, -1) {
				target := string(m[1])
				if id, ok := strings.CutPrefix(target, "#"); ok && len(anchors) > 0 && !anchors[id] {
					rel, _ := filepath.Rel(root, f)
					t.Errorf("%s:%d: link to %s: no such anchor in the page", rel, i+1, target)
				}
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
					rel, _ := filepath.Rel(root, f)
					t.Errorf("%s:%d: link to %s: no such file", rel, i+1, m[1])
				}
			}
		}
	}
}
