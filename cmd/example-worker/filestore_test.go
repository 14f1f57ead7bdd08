package main

import (
	"bytes"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
)

// The demo on --store=file, twice on one file: each run passes, the second
// opens the file the first closed, and the file holds the records of both
// runs (in the scope payments, each run with payment IDs of its own). A file another process holds is
// refused with ErrLocked, not waited for.
func TestDemoOnTheFileStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "oncemill.db")
	for run := range 2 {
		var stdout, stderr bytes.Buffer
		if code := realMain([]string{"--store=file", "--file-path=" + path, "--count=100"}, &stdout, &stderr); code != 0 {
			t.Fatalf("run %d: exit code %d\nstdout:\n%s\nstderr:\n%s", run+1, code, stdout.String(), stderr.String())
		}
		if want := "summary: published=100 deliveries=130 unique=100 effects=98 "; !strings.Contains(stdout.String(), want) {
			t.Fatalf("run %d: stdout %q does not contain %q", run+1, stdout.String(), want)
		}
	}

	st, err := filestore.New(filestore.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	scopes := map[string]int{}
	for req := (store.ListRequest{Limit: 1000}); ; {
		page, err := st.List(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			scopes[r.Scope]++
		}
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	// The demo keeps the scope payments; each run's payment IDs are its own.
	if want := map[string]int{"payments": 200}; !maps.Equal(scopes, want) {
		t.Fatalf("the file holds the records %v (per scope), want %v: both runs' 100 payments", scopes, want)
	}

	// st holds the file now.
	_, err = openStore(t.Context(), config{store: "file", filePath: path})
	if !errors.Is(err, filestore.ErrLocked) {
		t.Fatalf("openStore of a file held by another store = %v, want filestore.ErrLocked", err)
	}
}
