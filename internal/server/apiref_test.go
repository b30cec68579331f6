package server

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const apiReference = "../../docs/api-reference.md"

// TestAPIReference: docs/api-reference.md is what api/openapi.yaml says.
// After changing the spec, regenerate it:
//
//	AGENTVM_UPDATE_DOCS=1 go test ./internal/server -run TestAPIReference
func TestAPIReference(t *testing.T) {
	got := loadSpec(t).markdown(t)
	if os.Getenv("AGENTVM_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(apiReference, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(apiReference)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/api-reference.md is out of date with api/openapi.yaml: regenerate it with\n\tAGENTVM_UPDATE_DOCS=1 go test ./internal/server -run TestAPIReference")
	}
}

// markdown renders the spec as one page: the overview (info.description),
// the operations grouped by their first tag in the order of the tags list,
// each with its parameters, body and responses, and then every schema with
// its fields. Schema names link to their section.
func (o *openAPI) markdown(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("# API reference\n\nGenerated from [api/openapi.yaml](../api/openapi.yaml) by " +
		"`AGENTVM_UPDATE_DOCS=1 go test ./internal/server -run TestAPIReference`; the test fails when it is out of date. " +
		"The introduction, with examples, is [api.md](api.md).\n")
	info := get(o.root, "info")
	if v := get(info, "version"); v != nil {
		fmt.Fprintf(&b, "\nVersion %s.\n", v.Value)
	}
	if d := get(info, "description"); d != nil {
		fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(demoteHeadings(d.Value)))
	}

	type operation struct {
		method, path string
		op, item     *yaml.Node
	}
	byTag := map[string][]operation{}
	paths := get(o.root, "paths")
	for i := 0; i+1 < len(paths.Content); i += 2 {
		path, item := paths.Content[i].Value, paths.Content[i+1]
		for j := 0; j+1 < len(item.Content); j += 2 {
			method, op := item.Content[j].Value, item.Content[j+1]
			if !slices.Contains(httpMethods, method) {
				continue
			}
			tag := "other"
			if tags := get(op, "tags"); tags != nil && len(tags.Content) > 0 {
				tag = tags.Content[0].Value
			}
			byTag[tag] = append(byTag[tag], operation{method, path, op, item})
		}
	}
	var tags []string
	if tl := get(o.root, "tags"); tl != nil {
		for _, tn := range tl.Content {
			if n := get(tn, "name"); n != nil {
				tags = append(tags, n.Value)
			}
		}
	}
	for tag := range byTag {
		if !slices.Contains(tags, tag) {
			t.Errorf("operations are tagged %q, which the spec's tags list lacks", tag)
		}
	}

	b.WriteString("\n## Operations\n")
	for _, tag := range tags {
		ops := byTag[tag]
		if len(ops) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n- **%s**:", tag)
		for k, op := range ops {
			if k > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " [`%s %s`](#%s)", strings.ToUpper(op.method), op.path, anchor(op.op, op.method, op.path))
		}
		b.WriteString("\n")
	}
	for _, tag := range tags {
		ops := byTag[tag]
		if len(ops) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n", tag)
		if tl := get(o.root, "tags"); tl != nil {
			for _, tn := range tl.Content {
				if n, d := get(tn, "name"), get(tn, "description"); n != nil && n.Value == tag && d != nil {
					fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(d.Value))
				}
			}
		}
		for _, op := range ops {
			o.operation(&b, op.method, op.path, op.op, op.item)
		}
	}

	b.WriteString("\n## Schemas\n")
	schemas := get(get(o.root, "components"), "schemas")
	var names []string
	for i := 0; i+1 < len(schemas.Content); i += 2 {
		names = append(names, schemas.Content[i].Value)
	}
	slices.Sort(names)
	for _, name := range names {
		o.schema(&b, name, get(schemas, name))
	}
	return b.Bytes()
}

// anchor is the operation's heading id: its operationId, lowercased (the
// heading's own text would make GitHub's anchor depend on punctuation).
func anchor(op *yaml.Node, method, path string) string {
	if id := get(op, "operationId"); id != nil {
		return strings.ToLower(id.Value)
	}
	return strings.ToLower(method + strings.NewReplacer("/", "-", "{", "", "}", "").Replace(path))
}

func (o *openAPI) operation(b *bytes.Buffer, method, path string, op, item *yaml.Node) {
	fmt.Fprintf(b, "\n<a id=\"%s\"></a>\n### `%s %s`\n", anchor(op, method, path), strings.ToUpper(method), path)
	if s := get(op, "summary"); s != nil {
		fmt.Fprintf(b, "\n%s.\n", strings.TrimSuffix(strings.TrimSpace(s.Value), "."))
	}
	if d := get(op, "description"); d != nil {
		fmt.Fprintf(b, "\n%s\n", strings.TrimSpace(demoteHeadings(d.Value)))
	}
	var params []*yaml.Node
	for _, list := range []*yaml.Node{get(item, "parameters"), get(op, "parameters")} {
		if list != nil {
			for _, p := range list.Content {
				params = append(params, o.deref(p))
			}
		}
	}
	if len(params) > 0 {
		b.WriteString("\n| parameter | in | type | required | description |\n|---|---|---|---|---|\n")
		for _, p := range params {
			req := ""
			if r := get(p, "required"); r != nil && r.Value == "true" {
				req = "yes"
			}
			fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", value(get(p, "name")), value(get(p, "in")), o.typeOf(get(p, "schema")), req, cell(value(get(p, "description"))))
		}
	}
	if rb := o.deref(get(op, "requestBody")); rb != nil {
		req := "optional"
		if r := get(rb, "required"); r != nil && r.Value == "true" {
			req = "required"
		}
		fmt.Fprintf(b, "\nRequest body (%s)", req)
		if d := get(rb, "description"); d != nil {
			fmt.Fprintf(b, ": %s", cell(d.Value))
		}
		b.WriteString("\n\n")
		o.content(b, get(rb, "content"))
	}
	if rs := get(op, "responses"); rs != nil {
		b.WriteString("\n| status | meaning | body |\n|---|---|---|\n")
		for i := 0; i+1 < len(rs.Content); i += 2 {
			r := o.deref(rs.Content[i+1])
			var bodies []string
			if c := get(r, "content"); c != nil {
				for j := 0; j+1 < len(c.Content); j += 2 {
					bodies = append(bodies, fmt.Sprintf("`%s` %s", c.Content[j].Value, o.typeOf(get(c.Content[j+1], "schema"))))
				}
			}
			fmt.Fprintf(b, "| %s | %s | %s |\n", rs.Content[i].Value, cell(value(get(r, "description"))), strings.Join(bodies, "<br>"))
		}
	}
}

// content lists a body's media types and their schemas.
func (o *openAPI) content(b *bytes.Buffer, c *yaml.Node) {
	if c == nil {
		return
	}
	for j := 0; j+1 < len(c.Content); j += 2 {
		fmt.Fprintf(b, "- `%s`: %s\n", c.Content[j].Value, o.typeOf(get(c.Content[j+1], "schema")))
	}
}

func (o *openAPI) schema(b *bytes.Buffer, name string, s *yaml.Node) {
	fmt.Fprintf(b, "\n<a id=\"schema-%s\"></a>\n### %s\n", strings.ToLower(name), name)
	if d := get(s, "description"); d != nil {
		fmt.Fprintf(b, "\n%s\n", strings.TrimSpace(demoteHeadings(d.Value)))
	}
	props := get(s, "properties")
	if props == nil || len(props.Content) == 0 {
		fmt.Fprintf(b, "\n%s\n", o.typeOf(s))
		return
	}
	required := map[string]bool{}
	if r := get(s, "required"); r != nil {
		for _, n := range r.Content {
			required[n.Value] = true
		}
	}
	b.WriteString("\n| field | type | required | description |\n|---|---|---|---|\n")
	for i := 0; i+1 < len(props.Content); i += 2 {
		f, p := props.Content[i].Value, props.Content[i+1]
		req := ""
		if required[f] {
			req = "yes"
		}
		desc := value(get(p, "description"))
		if e := get(p, "example"); e != nil && e.Kind == yaml.ScalarNode {
			desc = strings.TrimSpace(desc + " (e.g. `" + e.Value + "`)")
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", f, o.typeOf(p), req, cell(desc))
	}
}

// typeOf renders a schema's type: a link for a reference, []T, map of T,
// an enum's values, a format.
func (o *openAPI) typeOf(s *yaml.Node) string {
	if s == nil {
		return ""
	}
	if ref := get(s, "$ref"); ref != nil {
		name := ref.Value[strings.LastIndex(ref.Value, "/")+1:]
		return fmt.Sprintf("[%s](#schema-%s)", name, strings.ToLower(name))
	}
	for _, k := range []string{"oneOf", "anyOf", "allOf"} {
		if alts := get(s, k); alts != nil {
			var parts []string
			for _, a := range alts.Content {
				parts = append(parts, o.typeOf(a))
			}
			sep := " or "
			if k == "allOf" {
				sep = " and "
			}
			return strings.Join(parts, sep)
		}
	}
	typ := value(get(s, "type"))
	switch typ {
	case "array":
		return "array of " + o.typeOf(get(s, "items"))
	case "object":
		if ap := get(s, "additionalProperties"); ap != nil && ap.Kind == yaml.MappingNode {
			return "map of " + o.typeOf(ap)
		}
	}
	if e := get(s, "enum"); e != nil {
		var vals []string
		for _, v := range e.Content {
			vals = append(vals, "`"+v.Value+"`")
		}
		typ += " (" + strings.Join(vals, ", ") + ")"
	}
	if f := get(s, "format"); f != nil {
		typ += " (" + f.Value + ")"
	}
	if n := get(s, "nullable"); n != nil && n.Value == "true" {
		typ += ", nullable"
	}
	return strings.TrimSpace(typ)
}

func value(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

// cell fits text into a table cell: one line, pipes escaped.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// demoteHeadings moves a description's own Markdown headings below the
// page's (an operation's section is a level-3 heading).
func demoteHeadings(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			lines[i] = "###" + l
		}
	}
	return strings.Join(lines, "\n")
}
