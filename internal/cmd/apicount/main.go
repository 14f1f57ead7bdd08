// Command apicount counts the library's exported identifiers: top-level
// exported types, functions, constants and variables, plus exported methods
// on any type, in the non-test files of every package outside cmd/,
// examples/, integration/ and internal/ (oncemilltest and store/storetest
// included). It prints a count per package, largest first, and the total;
// with -l it lists the names too.
//
//	go run ./internal/cmd/apicount [-l]
package main

import (
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// skipped are the directories whose packages are not the library's.
var skipped = map[string]bool{"cmd": true, "examples": true, "integration": true, "internal": true, "testdata": true}

func main() {
	list := flag.Bool("l", false, "list each package's exported names")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	names, err := count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	type pkg struct {
		dir string
		n   int
	}
	var pkgs []pkg
	total := 0
	for dir, ns := range names {
		pkgs = append(pkgs, pkg{dir, len(ns)})
		total += len(ns)
	}
	slices.SortFunc(pkgs, func(a, b pkg) int { return cmp.Or(b.n-a.n, strings.Compare(a.dir, b.dir)) })
	for _, p := range pkgs {
		fmt.Printf("%5d  %s\n", p.n, p.dir)
		if *list {
			slices.Sort(names[p.dir])
			fmt.Printf("       %s\n", strings.Join(names[p.dir], " "))
		}
	}
	fmt.Printf("%5d  total\n", total)
}

// count returns the exported identifiers per package directory under root.
func count(root string) (map[string][]string, error) {
	names := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (skipped[name] || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names[filepath.Dir(path)] = append(names[filepath.Dir(path)], exported(f)...)
		return nil
	})
	return names, err
}

// exported returns f's exported top-level names and exported methods
// (a method as Type.Name).
func exported(f *ast.File) []string {
	var names []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() {
				names = append(names, receiverPrefix(d)+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						names = append(names, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							names = append(names, name.Name)
						}
					}
				}
			}
		}
	}
	return names
}

// receiverPrefix is "Type." for a method and "" for a function.
func receiverPrefix(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "."
	}
	return ""
}
