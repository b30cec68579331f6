package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryTestIsParallel keeps the rule main_test.go states: each test's
// first statement is t.Parallel(), so scripts/test.sh's -parallel applies to
// all of them (a serial one would hold every parallel test back until it ends).
func TestEveryTestIsParallel(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	n := 0
	for _, f := range files {
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			n++
			if !firstIsParallel(fn) {
				t.Errorf("%s: %s does not call t.Parallel() first", f, fn.Name.Name)
			}
		}
	}
	if n < 40 {
		t.Fatalf("found %d tests, want the whole package's", n)
	}
	// t.Setenv and t.Chdir panic in a parallel test, and os.Setenv would
	// leak into the tests beside: neither here nor in the helpers they call.
	helpers, _ := filepath.Glob("testenv/*.go")
	for _, dir := range []string{"../internal/pgtest", "../internal/s3test"} {
		m, _ := filepath.Glob(dir + "/*.go")
		helpers = append(helpers, m...)
	}
	for _, f := range append(files, helpers...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{".Setenv(", ".Chdir("} {
			if f != "parallel_test.go" && strings.Contains(string(b), bad) {
				t.Errorf("%s calls %s): the tests run in parallel", f, bad)
			}
		}
	}
}

func firstIsParallel(fn *ast.FuncDecl) bool {
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return false
	}
	es, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Parallel" && len(call.Args) == 0
}
