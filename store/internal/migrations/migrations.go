// Package migrations reads a SQL store's embedded schema migrations,
// migrations/NNNN_name.sql, numbered 1, 2, 3... without a gap.
package migrations

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// File is one migration: its version, its name and its SQL.
type File struct {
	Version int
	Name    string
	SQL     string
}

// Load reads migrations/*.sql of fsys, in version order. store names the
// store in its errors ("postgres").
func Load(fsys fs.FS, store string) ([]File, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []File
	for _, f := range names {
		num, name, ok := strings.Cut(strings.TrimSuffix(path.Base(f), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("oncemill: %s: migration file %s is not named NNNN_name.sql", store, f)
		}
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		ms = append(ms, File{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("oncemill: %s: migrations are not numbered 1, 2, 3...: found %d at position %d", store, m.Version, i+1)
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("oncemill: %s: no embedded migrations", store)
	}
	return ms, nil
}

// Must is Load for the store's own embedded files, which a test keeps
// loadable: it panics on an error.
func Must(fsys fs.FS, store string) []File {
	ms, err := Load(fsys, store)
	if err != nil {
		panic(err)
	}
	return ms
}
