package vm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// list returns the templates of the template dir, newest first.
func (ts *templates) list() ([]*Template, error) {
	ents, err := os.ReadDir(ts.dir)
	if err != nil {
		return nil, err
	}
	var out []*Template
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if t, err := loadTemplate(filepath.Join(ts.dir, e.Name())); err == nil {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *Template) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}
