package console

import (
	"embed"
	"io/fs"
)

// dist is the built console (web/: `npm ci && npm run build`, which
// scripts/setup.sh runs). Only dist/.keep is committed, so a plain `go build`
// without the build embeds an empty directory and the console page says how
// to build it.
//
//go:embed all:dist
var dist embed.FS

// assets is the built console, or nil when the binary was built without it.
func assets() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		return nil
	}
	if _, err := fs.Stat(sub, "index.html"); err != nil {
		return nil
	}
	return sub
}
