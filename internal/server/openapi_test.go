package server

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/console"
	"github.com/agentvm/agentvm/internal/e2b"
	"gopkg.in/yaml.v3"
)

const specFile = "../../api/openapi.yaml"

// notInSpec are the patterns the server registers that api/openapi.yaml
// does not describe, with the reason. Each must be registered (a stale entry
// fails the test).
var notInSpec = map[string]string{
	"/": "the catch-alls: the outer one hands every other request to the auth middleware, the inner one answers 404 no such endpoint",
	// The web console (internal/console) is a page for browsers, not API.
	"GET /{$}":                "the web console's page (HTML)",
	"GET /ui/":                "the web console's scripts and styles",
	"GET /console/session":    "the web console's cookie session: who is signed in and the CSRF token, for the console's own page only (cross-origin requests are refused)",
	"POST /console/session":   "the web console's sign-in: sets the HttpOnly session cookie from a token; browsers only",
	"DELETE /console/session": "the web console's sign-out; browsers only",
	"/git/":                   "hosted git: git's own smart HTTP protocol (git http-backend), for git clients, not an API (docs/git.md)",
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// TestOpenAPIRoutes checks that every route the server registers is in
// api/openapi.yaml and that every operation there is registered (method and
// path; path parameter names aside, and a path parameter with an enum stands
// for one route per value). The patterns come from the registration itself
// (Server.router), with E2B's API (mounted unlisted) enabled; a route
// registered only under some other configuration must be enabled here too.
// A pattern without a method (/mcp) is matched by any documented method.
func TestOpenAPIRoutes(t *testing.T) {
	spec := loadSpec(t)
	s := &Server{e2b: e2b.New(e2b.Config{}), console: console.New(console.Config{})}
	_, patterns := s.router()

	served := map[string]bool{}    // "METHOD /path/{}" of method patterns
	anyMethod := map[string]bool{} // "/path/{}" of patterns without a method
	excluded := map[string]bool{}
	for _, p := range patterns {
		if _, ok := notInSpec[p]; ok {
			excluded[p] = true
			continue
		}
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			method, path = "", p
		}
		if !strings.HasPrefix(path, "/") {
			t.Fatalf("pattern %q: host patterns are not supported by this test", p)
		}
		if method == "" {
			anyMethod[normPath(path)] = true
		} else {
			served[method+" "+normPath(path)] = true
		}
	}
	for p := range notInSpec {
		if !excluded[p] {
			t.Errorf("notInSpec lists %q, which the server does not register", p)
		}
	}

	documented := map[string]string{} // "METHOD /path/{}" -> where in the spec
	docPaths := map[string]bool{}
	for _, r := range spec.routes(t) {
		documented[r.key] = r.where
		docPaths[normPath(strings.SplitN(r.key, " ", 2)[1])] = true
	}
	if len(served) < 50 || len(documented) < 50 {
		t.Fatalf("too few routes to compare (served %d, documented %d): is the recorder or the spec parser broken?", len(served), len(documented))
	}

	var undocumented, unserved []string
	for k := range served {
		if _, ok := documented[k]; !ok {
			undocumented = append(undocumented, k)
		}
	}
	for p := range anyMethod {
		if !docPaths[p] {
			undocumented = append(undocumented, "(any method) "+p)
		}
	}
	for k, where := range documented {
		path := strings.SplitN(k, " ", 2)[1]
		if !served[k] && !anyMethod[path] {
			unserved = append(unserved, k+"  ("+where+")")
		}
	}
	slices.Sort(undocumented)
	slices.Sort(unserved)
	if len(undocumented) > 0 {
		t.Errorf("%d route(s) served but not in %s (document them, or list them in notInSpec with a reason):\n\t%s",
			len(undocumented), specFile, strings.Join(undocumented, "\n\t"))
	}
	if len(unserved) > 0 {
		t.Errorf("%d route(s) in %s that the server does not serve:\n\t%s",
			len(unserved), specFile, strings.Join(unserved, "\n\t"))
	}
}

var wildcard = regexp.MustCompile(`\{[^}$]*\}`)

// normPath blanks the names of path parameters: {id}, {vm} and {rest...}
// all become {}.
func normPath(p string) string { return wildcard.ReplaceAllString(p, "{}") }

// TestOpenAPIWellFormed checks the parts of api/openapi.yaml that tools
// generating clients from it rely on.
func TestOpenAPIWellFormed(t *testing.T) {
	spec := loadSpec(t)
	root := spec.root
	if v := get(root, "openapi"); v == nil || !strings.HasPrefix(v.Value, "3.") {
		t.Errorf("openapi: want a 3.x version")
	}
	info := get(root, "info")
	if get(info, "title") == nil || get(info, "version") == nil {
		t.Errorf("info needs title and version")
	}
	// Every $ref resolves within the file.
	var walk func(n *yaml.Node, at string)
	walk = func(n *yaml.Node, at string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if k.Value == "$ref" {
					if _, err := spec.lookup(v.Value); err != nil {
						t.Errorf("%s (line %d): $ref %q: %v", at, v.Line, v.Value, err)
					}
					continue
				}
				walk(v, at+"/"+k.Value)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s/%d", at, i))
			}
		}
	}
	walk(root, "#")
	// routes checks operations, parameters and operationIds.
	spec.routes(t)
}

type openAPI struct {
	root *yaml.Node // the document's top mapping
}

func loadSpec(t *testing.T) *openAPI {
	t.Helper()
	b, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", specFile, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("%s: not a YAML mapping", specFile)
	}
	return &openAPI{root: doc.Content[0]}
}

// get is the value of key in mapping n, or nil.
func get(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// lookup resolves a local reference ("#/components/...").
func (o *openAPI) lookup(ref string) (*yaml.Node, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("only references within the file (#/...) are supported")
	}
	n := o.root
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		if n = get(n, tok); n == nil {
			return nil, fmt.Errorf("no %q", tok)
		}
	}
	return n, nil
}

// deref follows n's $ref (if any); errors are reported by the well-formedness
// test, here an unresolvable reference is nil.
func (o *openAPI) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && i < 10; i++ {
		ref := get(n, "$ref")
		if ref == nil {
			return n
		}
		n, _ = o.lookup(ref.Value)
	}
	return n
}

type specRoute struct {
	key   string // "METHOD /path/{}" with enum parameters expanded
	where string // "post /v1/vms/{id}/... (operationId)"
}

// routes lists the spec's operations, checking as it goes that each has
// responses and a unique operationId and that its path parameters and the
// template's match.
func (o *openAPI) routes(t *testing.T) []specRoute {
	t.Helper()
	paths := get(o.root, "paths")
	if paths == nil || paths.Kind != yaml.MappingNode {
		t.Fatalf("%s: no paths", specFile)
	}
	var out []specRoute
	opIDs := map[string]string{}
	for i := 0; i+1 < len(paths.Content); i += 2 {
		path, item := paths.Content[i].Value, paths.Content[i+1]
		if !strings.HasPrefix(path, "/") {
			t.Errorf("path %q does not start with /", path)
		}
		template := map[string]bool{}
		for _, m := range regexp.MustCompile(`\{([^}]*)\}`).FindAllStringSubmatch(path, -1) {
			template[m[1]] = true
		}
		for j := 0; j+1 < len(item.Content); j += 2 {
			method, op := item.Content[j].Value, item.Content[j+1]
			if !slices.Contains(httpMethods, method) {
				if !slices.Contains([]string{"parameters", "summary", "description", "servers"}, method) {
					t.Errorf("%s: unknown key %q", path, method)
				}
				continue
			}
			where := method + " " + path
			if id := get(op, "operationId"); id != nil {
				where += " (" + id.Value + ")"
				if prev, dup := opIDs[id.Value]; dup {
					t.Errorf("operationId %q is used by %s and %s", id.Value, prev, method+" "+path)
				}
				opIDs[id.Value] = method + " " + path
			}
			if r := get(op, "responses"); r == nil || len(r.Content) == 0 {
				t.Errorf("%s: no responses", where)
			}
			// Path parameters: the operation's override the path's.
			params := map[string]*yaml.Node{} // name -> schema
			for _, list := range []*yaml.Node{get(item, "parameters"), get(op, "parameters")} {
				if list == nil {
					continue
				}
				for _, p := range list.Content {
					p = o.deref(p)
					in, name := get(p, "in"), get(p, "name")
					if in == nil || name == nil {
						t.Errorf("%s: a parameter without name or in", where)
						continue
					}
					if in.Value != "path" {
						continue
					}
					if req := get(p, "required"); req == nil || req.Value != "true" {
						t.Errorf("%s: path parameter %q must be required: true", where, name.Value)
					}
					params[name.Value] = o.deref(get(p, "schema"))
				}
			}
			for name := range template {
				if _, ok := params[name]; !ok {
					t.Errorf("%s: path parameter {%s} is not declared", where, name)
				}
			}
			for name := range params {
				if !template[name] {
					t.Errorf("%s: path parameter %q is not in the path", where, name)
				}
			}
			// A parameter with an enum is one route per value.
			concrete := []string{path}
			for name, schema := range params {
				enum := get(schema, "enum")
				if enum == nil {
					continue
				}
				var next []string
				for _, c := range concrete {
					for _, v := range enum.Content {
						next = append(next, strings.ReplaceAll(c, "{"+name+"}", v.Value))
					}
				}
				concrete = next
			}
			for _, c := range concrete {
				out = append(out, specRoute{key: strings.ToUpper(method) + " " + normPath(c), where: where})
			}
		}
	}
	return out
}
