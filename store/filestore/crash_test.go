package filestore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/store"
)

// crashChildEnv, set, makes the test binary the crash test's worker: it
// holds "<store file>\n<effects file>".
const crashChildEnv = "ONCEMILL_FILESTORE_CRASH_CHILD"

const (
	crashKeys  = 200
	crashKills = 5
	crashScope = "crash"
	// crashLease is short so that a restarted worker takes over the key
	// its killed predecessor held without waiting long.
	crashLease = 20 * time.Millisecond
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashChildEnv); spec != "" {
		dbPath, effectsPath, _ := strings.Cut(spec, "\n")
		if err := crashWorker(dbPath, effectsPath); err != nil {
			fmt.Fprintln(os.Stderr, "crash worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashWorker handles keys k-000..k-199 in order in the lease mode, as the
// idempotency stage does: claim, the effect (a line appended to the
// effects file and synced), complete. A key held by a killed predecessor
// is waited for until its lease runs out, then taken over.
func crashWorker(dbPath, effectsPath string) error {
	s, err := New(Options{Path: dbPath, OpenTimeout: 10 * time.Second, CleanupInterval: -1})
	if err != nil {
		return err
	}
	defer s.Close()
	effects, err := os.OpenFile(effectsPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer effects.Close()
	fmt.Println("ready") // the kill's delay starts here
	ctx := context.Background()
	for i := range crashKeys {
		key := crashKey(i)
		for done := false; !done; {
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: crashScope, Key: key, LeaseDuration: crashLease})
			if err != nil {
				return err
			}
			switch res.Decision {
			case store.DecisionReplay:
				done = true
			case store.DecisionHeld:
				time.Sleep(10 * time.Millisecond)
			case store.DecisionExecute:
				// The pauses spread the kills over every step.
				time.Sleep(200 * time.Microsecond)
				if _, err := fmt.Fprintf(effects, "%s %d\n", key, res.Claim.Token); err != nil {
					return err
				}
				if err := effects.Sync(); err != nil {
					return err
				}
				time.Sleep(200 * time.Microsecond)
				if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
					return err
				}
				done = true
			default:
				return fmt.Errorf("%s: unexpected decision %v", key, res.Decision)
			}
		}
	}
	return nil
}

func crashKey(i int) string { return fmt.Sprintf("k-%03d", i) }

// crashState is what the file and the effects say after a worker ended.
type crashState struct {
	status  map[string]store.Status
	effects map[string]int
}

// inspect reopens the file, checks its pages (bbolt's consistency check)
// and reads the records and the effects.
func inspect(t *testing.T, dbPath, effectsPath string) crashState {
	t.Helper()
	s, err := New(Options{Path: dbPath, OpenTimeout: 5 * time.Second, CleanupInterval: -1})
	if err != nil {
		t.Fatalf("reopening the file after the worker ended: %v", err)
	}
	defer s.Close()
	err = s.db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatalf("the file is corrupt: %v", err)
	}
	st := crashState{status: map[string]store.Status{}, effects: map[string]int{}}
	for req := (store.ListRequest{Scope: crashScope, Limit: 1000}); ; {
		page, err := s.List(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			st.status[r.Key] = r.Status
		}
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	f, err := os.Open(effectsPath)
	if errors.Is(err, os.ErrNotExist) {
		return st
	} else if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		key, token, ok := strings.Cut(lines.Text(), " ")
		if _, err := strconv.ParseInt(token, 10, 64); !ok || err != nil {
			t.Fatalf("malformed effect line %q", lines.Text())
		}
		st.effects[key]++
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	return st
}

// A worker SIGKILLed at random points, five times, then run to the end:
// every key ends succeeded, the file reopens intact after each kill, a key
// recorded as succeeded before a kill is never run again, and only a key
// in flight at a kill (at most one per kill) has its effect twice.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dbPath, effectsPath := filepath.Join(dir, "oncemill.db"), filepath.Join(dir, "effects.log")
	worker := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dbPath+"\n"+effectsPath)
		cmd.Stderr = os.Stderr
		return cmd
	}

	inFlightAt := map[string]int{}      // key: kills at which it was in progress
	effectsWhenDone := map[string]int{} // key: its effects when first seen succeeded
	for kill := range crashKills {
		cmd := worker()
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
			t.Fatalf("kill %d: the worker did not start: %q, %v", kill+1, line, err)
		}
		time.Sleep(time.Duration(10+rand.IntN(71)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: the worker was not killed (%v): it ended before the kill; raise crashKeys", kill+1, err)
		}
		st := inspect(t, dbPath, effectsPath)
		inProgress := 0
		for key, status := range st.status {
			switch status {
			case store.StatusInProgress:
				inProgress++
				inFlightAt[key]++
			case store.StatusSucceeded:
				if _, seen := effectsWhenDone[key]; !seen {
					effectsWhenDone[key] = st.effects[key]
				}
			}
		}
		if inProgress > 1 {
			t.Fatalf("kill %d: %d keys in progress; the worker runs one at a time", kill+1, inProgress)
		}
		t.Logf("kill %d: %d keys succeeded, %d in progress", kill+1, len(effectsWhenDone), inProgress)
	}
	if err := worker().Run(); err != nil {
		t.Fatalf("the last worker: %v", err)
	}

	st := inspect(t, dbPath, effectsPath)
	doubled := 0
	for i := range crashKeys {
		key := crashKey(i)
		if st.status[key] != store.StatusSucceeded {
			t.Errorf("%s ended %v, want succeeded", key, st.status[key])
		}
		n := st.effects[key]
		if before, ok := effectsWhenDone[key]; ok && n != before {
			t.Errorf("%s was succeeded at a kill with %d effects, and has %d now: it ran again", key, before, n)
		}
		if n < 1 || n > 1+inFlightAt[key] {
			t.Errorf("%s has %d effects; in flight at %d kills, so want 1 to %d", key, n, inFlightAt[key], 1+inFlightAt[key])
		}
		if n > 1 {
			doubled++
		}
	}
	if len(st.effects) != crashKeys {
		t.Errorf("effects for %d keys, want %d", len(st.effects), crashKeys)
	}
	t.Logf("%d keys, %d kills: %d keys succeeded before a kill, %d keys with their effect twice", crashKeys, crashKills, len(effectsWhenDone), doubled)
}
