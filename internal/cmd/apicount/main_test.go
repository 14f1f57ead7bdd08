package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestCountFollowsTheRules(t *testing.T) {
	root := t.TempDir()
	write := func(path, src string) {
		t.Helper()
		path = filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Counted: T, New, (T).Do, (t).Do (an exported method on any type), A,
	// B, V; not: unexported names and methods, tests, the skipped folders.
	write("lib/lib.go", `package lib
type T struct{ Field int }
type t struct{}
func New() T { return T{} }
func (T) Do() {}
func (T) do() {}
func (t) Do() {}
const A, B, c = 1, 2, 3
var V = 1
`)
	write("lib/lib_test.go", "package lib\nfunc TestX() {}\n")
	for _, dir := range []string{"cmd", "examples", "integration", "internal", "lib/testdata"} {
		write(dir+"/x.go", "package x\nfunc Exported() {}\n")
	}
	got, err := count(root)
	if err != nil {
		t.Fatal(err)
	}
	lib := got[filepath.Join(root, "lib")]
	slices.Sort(lib)
	if want := []string{"A", "B", "New", "T", "T.Do", "V", "t.Do"}; len(got) != 1 || !slices.Equal(lib, want) {
		t.Fatalf("names %v, want %v for lib only", got, want)
	}
}

// surfaceBound is the most names the library exports: the count. A change
// that adds exports removes as many, or raises it and gives its reason in
// the change.
const surfaceBound = 283

// The library's surface stays within surfaceBound.
func TestLibrarySurfaceWithinBound(t *testing.T) {
	names, err := count(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, ns := range names {
		total += len(ns)
	}
	if total == 0 || total > surfaceBound {
		t.Fatalf("the library exports %d identifiers, want at most %d (go run ./internal/cmd/apicount -l)", total, surfaceBound)
	}
}
