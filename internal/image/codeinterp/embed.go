// Package codeinterp holds the code-interpreter server that the
// code-interpreter image runs inside the guest: server.py drives Jupyter
// kernels (Python), jskernel.js (JavaScript) and bash, and answers E2B's
// code-interpreter protocol on 127.0.0.1:49999. The host reaches it through
// the guest agent (the native /v1/vms/{id}/code API) and the preview proxy
// (E2B's SDKs).
package codeinterp

import "embed"

//go:embed server.py jskernel.js
var files embed.FS

// Files returns the files to install, by name.
func Files() map[string]string {
	out := map[string]string{}
	for _, n := range []string{"server.py", "jskernel.js"} {
		b, err := files.ReadFile(n)
		if err != nil {
			panic(err) // embedded at build time: cannot fail
		}
		out[n] = string(b)
	}
	return out
}
