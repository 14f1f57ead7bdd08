package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	file := func(sql string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(sql)} }
	ms, err := Load(fstest.MapFS{
		"migrations/0002_second.sql": file("B"),
		"migrations/0001_first.sql":  file("A"),
	}, "test")
	if err != nil || len(ms) != 2 || ms[0] != (File{1, "first", "A"}) || ms[1] != (File{2, "second", "B"}) {
		t.Fatalf("Load = %+v, %v; want versions 1 and 2 in order", ms, err)
	}
	for _, c := range []struct {
		fsys fstest.MapFS
		want string
	}{
		{fstest.MapFS{"migrations/first.sql": file("A")}, "is not named NNNN_name.sql"},
		{fstest.MapFS{"migrations/0001_a.sql": file("A"), "migrations/0003_c.sql": file("C")}, "found 3 at position 2"},
		{fstest.MapFS{}, "no embedded migrations"},
	} {
		if _, err := Load(c.fsys, "test"); err == nil || !strings.Contains(err.Error(), "oncemill: test: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%v) = %v, want an error naming the store and %q", c.fsys, err, c.want)
		}
	}
}
