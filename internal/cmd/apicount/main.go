// Command apicount counts the library's exported identifiers: top-level
// exported types, functions, constants and variables, plus exported methods
// on any type, in the non-test files of every package outside cmd/,
// examples/, integration/ and internal/ (oncemilltest and store/storetest
// included). It prints a count per package, largest first, and the total.
//
//	go run ./internal/cmd/apicount
package main

import (
	"cmp"
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
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	counts, err := count(root)
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
	for dir, n := range counts {
		pkgs = append(pkgs, pkg{dir, n})
		total += n
	}
	slices.SortFunc(pkgs, func(a, b pkg) int { return cmp.Or(b.n-a.n, strings.Compare(a.dir, b.dir)) })
	for _, p := range pkgs {
		fmt.Printf("%5d  %s\n", p.n, p.dir)
	}
	fmt.Printf("%5d  total\n", total)
}

// count returns the exported identifiers per package directory under root.
func count(root string) (map[string]int, error) {
	counts := map[string]int{}
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
		counts[filepath.Dir(path)] += exported(f)
		return nil
	})
	return counts, err
}

// exported counts f's exported top-level names and exported methods.
func exported(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() {
				n++
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n++
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}
