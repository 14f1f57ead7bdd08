package oncemilltest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs/pipeline.md ("Testing handlers") shows every exported Deliver*
// helper as declared, in its block of declarations, and its call form in
// the table, with the parameters' names in order: the helpers differ in
// what they take (DeliverAfterCrash a builder constructor), so the docs must
// say which.
func TestDocsShowTheDeliverHelpers(t *testing.T) {
	doc, err := os.ReadFile("../docs/pipeline.md")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset, found := token.NewFileSet(), 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || !strings.HasPrefix(fn.Name.Name, "Deliver") {
				continue
			}
			found++
			// The declaration as written, from the parameters' "(" to the
			// end of the results, on one line.
			from, to := fset.Position(fn.Type.Params.Opening).Offset, fset.Position(fn.Type.End()).Offset
			decl := "func " + fn.Name.Name + strings.Join(strings.Fields(string(src[from:to])), " ")
			decl = strings.ReplaceAll(strings.ReplaceAll(decl, "( ", "("), " )", ")")
			if !strings.Contains(string(doc), "\n"+decl+"\n") {
				t.Errorf("docs/pipeline.md does not show %s as declared; want the line\n%s", fn.Name.Name, decl)
			}
			var names []string
			for _, field := range fn.Type.Params.List {
				for _, n := range field.Names {
					names = append(names, n.Name)
				}
			}
			call := "| `" + fn.Name.Name + "(" + strings.Join(names, ", ") + ")` |"
			if !strings.Contains(string(doc), "\n"+call) {
				t.Errorf("docs/pipeline.md's table of helpers has no row starting %s", call)
			}
		}
	}
	if found < 3 {
		t.Errorf("found %d exported Deliver* functions in oncemilltest, want at least DeliverTwice, DeliverConcurrently and DeliverAfterCrash", found)
	}
}
