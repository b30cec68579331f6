// Package codeinterp holds the code-interpreter server that the
// code-interpreter image runs inside the guest: server.py drives Jupyter
// kernels (Python, R), jskernel.js (JavaScript, TypeScript), JShellKernel.java
// (Java) and bash, and answers E2B's
// code-interpreter protocol on 127.0.0.1:49999. The host reaches it through
// the guest agent (the native /v1/vms/{id}/code API) and the preview proxy
// (E2B's SDKs).
package codeinterp

import "embed"

// names are the files server.py needs at run time, installed side by side
// (server.py imports the Python modules from its own directory).
var names = []string{
	"server.py",         // HTTP server, main
	"state.py",          // contexts, users, sandbox env
	"common.py",         // constants, errors, helpers
	"contexts.py",       // Stream, Context base
	"bashcontext.py",    // bash contexts
	"jupyter.py",        // contexts of Jupyter kernels
	"pycontext.py",      // Python contexts (ipykernel)
	"rcontext.py",       // R contexts (IRkernel)
	"jscontext.py",      // JavaScript and TypeScript contexts
	"javacontext.py",    // Java contexts
	"JShellKernel.java", // runs in each JVM
	"kernel_module.py",  // runs inside each Python kernel
	"peers.py",          // client uid check (/proc/net/tcp)
	"jskernel.js",       // runs in each node process
}

//go:embed server.py state.py common.py contexts.py bashcontext.py jupyter.py pycontext.py rcontext.py jscontext.py javacontext.py JShellKernel.java kernel_module.py peers.py jskernel.js
var files embed.FS

// Files returns the files to install, by name.
func Files() map[string]string {
	out := map[string]string{}
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			panic(err) // embedded at build time: cannot fail
		}
		out[n] = string(b)
	}
	return out
}
