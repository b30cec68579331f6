package vm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Templates lists the templates in the template dir (every image and shape
// that has been cold-booted once), newest first.
func (s *Service) Templates() ([]*Template, error) {
	ents, err := os.ReadDir(s.cfg.TemplateDir)
	if err != nil {
		return nil, err
	}
	var out []*Template
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if t, err := loadTemplate(filepath.Join(s.cfg.TemplateDir, e.Name())); err == nil {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b *Template) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}
