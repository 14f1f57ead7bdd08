package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
)

// While a worker holds the file store, every command fails within the lock
// wait, names the file and says to stop the worker, and changes nothing;
// once the worker has let go, the same command works.
func TestFileStoreHeldByAWorker(t *testing.T) {
	t.Parallel()
	fx := newFileFixture(t) // its store holds the file, as a running worker's does
	seed(t, fx.st, scope)
	t.Run("held", func(t *testing.T) {
		for _, args := range [][]string{
			{"inspect", "--scope", scope, "--key", keyFailed},
			{"list", "--scope", scope},
			{"stats"},
			{"release", "--yes", "--scope", scope, "--key", keyFailed},
			{"purge", "--scope", scope, "--dry-run=false"},
			{"migrate"},
		} {
			t.Run(args[0], func(t *testing.T) {
				t.Parallel() // each waits out the lock
				start := time.Now()
				r := runCLI(t, nil, append(fileFlags(fx.file.path), args...)...).mustCode(t, exitError)
				if took := time.Since(start); took > fileLockWait+2*time.Second {
					t.Errorf("%s on a held file took %v, want about the lock wait %v", args[0], took, fileLockWait)
				}
				if !strings.Contains(r.stderr, fx.file.path) || !strings.Contains(r.stderr, "Stop that worker") {
					t.Errorf("%s on a held file: stderr %q, want the file and what to do", args[0], r.stderr)
				}
			})
		}
	})
	if got := listAll(t, fx.st, scope); len(got) != len(fx.storedKeys()) {
		t.Fatalf("after the refused commands: %d records, want %d", len(got), len(fx.storedKeys()))
	}
	fx.cli(t, nil, "release", "--yes", "--scope", scope, "--key", keyFailed).mustCode(t, exitOK)
	if _, err := fx.st.Get(t.Context(), scope, keyFailed); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after the release with the file let go: %v, want store.ErrNotFound", err)
	}
}

// A record whose bytes were damaged on disk (the file itself sound) is an
// error of inspect, list, stats and purge that names it; release refuses
// it without --force, and with --force deletes it, after which every
// command works and the key's next delivery runs from attempt 1.
func TestFileStoreGarbledRecordIsReleased(t *testing.T) {
	t.Parallel()
	fx := newFileFixture(t)
	seed(t, fx.st, scope)
	fx.file.close(t)
	garbleRecord(t, fx.file.path, "card declined: do not honour") // keyFailed's cached error
	fx.file.open(t)

	name := `"payments"/"failed"`
	r := fx.cli(t, nil, "inspect", "--scope", scope, "--key", keyFailed).mustCode(t, exitError)
	if !strings.Contains(r.stderr, name) || !strings.Contains(r.stderr, "cannot be decoded") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("inspect of the garbled record: stderr %q, want it named and the release that removes it", r.stderr)
	}
	for _, args := range [][]string{{"list", "--scope", scope}, {"stats"}, {"purge", "--scope", scope}} {
		r := fx.cli(t, nil, args...).mustCode(t, exitError)
		if !strings.Contains(r.stderr, name) || !strings.Contains(r.stderr, `"oncemill release --scope=SCOPE --key=KEY --force"`) {
			t.Errorf("%s with a garbled record: stderr %q, want it named and the release that removes it", args[0], r.stderr)
		}
	}
	r = fx.cli(t, nil, "release", "--yes", "--scope", scope, "--key", keyFailed).mustCode(t, exitRefused)
	if !strings.Contains(r.stderr, "cannot be read") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("release of the garbled record without --force: stderr %q", r.stderr)
	}
	r = fx.cli(t, nil, "--json", "release", "--force", "--yes", "--scope", scope, "--key", keyFailed).mustCode(t, exitOK)
	if out := jsonObject[releaseView](t, r); out != (releaseView{Action: "released", Scope: scope, Key: keyFailed, Status: statusUnreadable, Forced: true}) {
		t.Errorf("release --force of the garbled record printed %+v", out)
	}

	keys := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--scope", scope).mustCode(t, exitOK))
	if len(keys) != len(fx.storedKeys())-1 {
		t.Errorf("list after the release: %+v, want every record but %s", keys, keyFailed)
	}
	fx.cli(t, nil, "stats").mustCode(t, exitOK)
	fx.cli(t, nil, "inspect", "--scope", scope, "--key", keyFailed).mustCode(t, exitNotFound)
	if next := decide(t, fx.st, scope, keyFailed); next.Decision != store.DecisionExecute || next.Claim.Attempt != 1 {
		t.Errorf("the next delivery after the release: %+v, want execute at attempt 1", next)
	}
	// A readable record is not deleted unread: release --force reads it and
	// shows it as for every store.
	r = fx.cli(t, nil, "release", "--force", "--yes", "--scope", scope, "--key", keySucceeded).mustCode(t, exitOK)
	if !strings.Contains(r.stdout, "was succeeded") {
		t.Errorf("release --force of a readable record: %q", r.stdout)
	}
}

// garbleRecord damages the record that holds text in the file at path, in
// place, as a bad sector would: the quote that ends text in the record's
// JSON becomes a control character, so the value no longer decodes while
// every page stays sound. Each copy of it is garbled (an older copy may
// remain in a free page).
func garbleRecord(t *testing.T, path, text string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	quoted := []byte(text + `"`)
	if n := bytes.Count(b, quoted); n == 0 {
		t.Fatalf("%s holds no %q", path, quoted)
	}
	b = bytes.ReplaceAll(b, quoted, append([]byte(text), 0x01))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A path without a file is not a store to create: not found, naming the
// flag, and nothing is created. A truncated file is an error naming it.
func TestFileStoreMissingOrDamagedFile(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "typo.db")
	r := runCLI(t, nil, append(fileFlags(missing), "stats")...).mustCode(t, exitNotFound)
	if !strings.Contains(r.stderr, missing) || !strings.Contains(r.stderr, "--file-path") {
		t.Errorf("stats of a missing file: stderr %q", r.stderr)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the CLI created %s: %v", missing, err)
	}

	damaged := &heldFile{path: filepath.Join(t.TempDir(), "oncemill.db")}
	damaged.open(t)
	seed(t, damaged, scope)
	damaged.close(t)
	fi, err := os.Stat(damaged.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(damaged.path, min(fi.Size()/2, 3*int64(os.Getpagesize()))); err != nil { // the meta pages and little more
		t.Fatal(err)
	}
	r = runCLI(t, nil, append(fileFlags(damaged.path), "list")...).mustCode(t, exitError)
	if !strings.Contains(r.stderr, damaged.path) || !strings.Contains(r.stderr, "damaged file") {
		t.Errorf("list of a truncated file: stderr %q, want the file named as damaged", r.stderr)
	}
}
