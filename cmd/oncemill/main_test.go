package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
	"github.com/oncemill/oncemill/store/postgres"
)

const scope = "payments"

// TestInspect shows one record in every state, as a table and as JSON, and
// exits 3 for a key without a live record.
func TestInspect(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		s := seed(t, fx.st, scope)

		live := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--scope", scope, "--key", keyLive).mustCode(t, exitOK))
		if live.Status != "in_progress" || !live.Live || live.Token != s.liveLease.Token || live.Attempt != 1 || live.LeaseExpiresAt == nil {
			t.Errorf("live lease: %+v, want in_progress, live, token %d, attempt 1, a lease expiry", live, s.liveLease.Token)
		}
		if left, err := time.ParseDuration(live.ExpiresIn); err != nil || left <= 0 {
			t.Errorf("live lease: expires_in %q, want a positive duration (%v)", live.ExpiresIn, err)
		}
		table := fx.cli(t, nil, "inspect", "--scope", scope, "--key", keyLive).mustCode(t, exitOK).stdout
		for _, want := range []string{"status", "in_progress", "token", "lease expires", "time left", "result", "0 bytes"} {
			if !strings.Contains(table, want) {
				t.Errorf("inspect table lacks %q:\n%s", want, table)
			}
		}

		ok := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--messages", "--scope", scope, "--key", keySucceeded).mustCode(t, exitOK))
		if ok.Status != "succeeded" || ok.ResultBytes != len(storedResult) || ok.ResultBase64 == nil || ok.LeaseExpiresAt != nil {
			t.Fatalf("success: %+v, want succeeded with %d result bytes and the result", ok, len(storedResult))
		}
		if raw, err := base64.StdEncoding.DecodeString(*ok.ResultBase64); err != nil || string(raw) != string(storedResult) {
			t.Errorf("success: result %q (%v), want %q", raw, err, storedResult)
		}
		dump := fx.cli(t, nil, "inspect", "--messages", "--scope", scope, "--key", keySucceeded).mustCode(t, exitOK).stdout
		if !strings.Contains(dump, fmt.Sprintf("stored result, %d bytes", len(storedResult))) || !strings.Contains(dump, "|produced: order-|") {
			t.Errorf("inspect --messages does not dump the result:\n%s", dump)
		}

		failed := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--scope", scope, "--key", keyFailed).mustCode(t, exitOK))
		if failed.Status != "cached_failure" || failed.ErrorKind != "cached" || failed.ErrorMessage != "card declined: do not honour" {
			t.Errorf("cached failure: %+v", failed)
		}
		table = fx.cli(t, nil, "inspect", "--scope", scope, "--key", keyFailed).mustCode(t, exitOK).stdout
		if !strings.Contains(table, "error kind") || !strings.Contains(table, "card declined: do not honour") {
			t.Errorf("inspect table lacks the cached error:\n%s", table)
		}

		retryable := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--scope", scope, "--key", keyRetryable).mustCode(t, exitOK))
		if retryable.Status != "retryable" || retryable.Attempt != 1 || !retryable.Live {
			t.Errorf("released key: %+v", retryable)
		}

		// A key that starts with a dash, after --; shown quoted in the table.
		odd := begin(t, fx.st, scope, "-odd key", long)
		if v := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--scope", scope, "--key=-odd key").mustCode(t, exitOK)); v.Token != odd.Token {
			t.Errorf("inspect of a key after --: %+v, want token %d", v, odd.Token)
		}
		if out := fx.cli(t, nil, "inspect", "--key=-odd key", "--scope="+scope).mustCode(t, exitOK).stdout; !strings.Contains(out, `"-odd key"`) {
			t.Errorf("a key with a space is not quoted:\n%s", out)
		}

		for _, key := range []string{keyDeadLease, keyExpiredSuccess, "never-seen"} {
			r := fx.cli(t, nil, "inspect", "--scope", scope, "--key", key).mustCode(t, exitNotFound)
			if r.stdout != "" || !strings.Contains(r.stderr, "no live record for payments/"+key) {
				t.Errorf("inspect %s: stdout %q, stderr %q", key, r.stdout, r.stderr)
			}
		}
	})
}

// TestList lists the records in every state, filtered and paged.
func TestList(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		seed(t, fx.st, scope)
		seed(t, fx.st, "emails")

		all := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--scope", scope).mustCode(t, exitOK))
		var keys []string
		for _, r := range all {
			keys = append(keys, r.Key)
			wantLive := r.Key != keyDeadLease && r.Key != keyExpiredSuccess
			if r.Live != wantLive {
				t.Errorf("%s: live %v, want %v", r.Key, r.Live, wantLive)
			}
			if r.Scope != scope {
				t.Errorf("%s: scope %q, want %q", r.Key, r.Scope, scope)
			}
		}
		want := fx.storedKeys()
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Fatalf("list --scope: keys %v, want %v in order", keys, want)
		}

		failed := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--status", "cached_failure").mustCode(t, exitOK))
		if len(failed) != 2 || failed[0].Scope != "emails" || failed[1].Scope != scope || failed[0].Key != keyFailed || failed[0].ErrorKind != "cached" {
			t.Errorf("list --status cached_failure: %+v", failed)
		}

		inProgress := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--scope", scope, "--status", "in_progress").mustCode(t, exitOK))
		if len(inProgress) != 2 || inProgress[0].Key != keyDeadLease || inProgress[1].Key != keyLive {
			t.Errorf("list --status in_progress: %+v", inProgress)
		}

		// Paged: two records a page, continued with the cursor it prints.
		var paged []string
		args := []string{"--json", "list", "--scope", scope, "--limit", "2"}
		for pages := 1; ; pages++ {
			r := fx.cli(t, nil, args...).mustCode(t, exitOK)
			for _, rec := range jsonLines[recordView](t, r) {
				paged = append(paged, rec.Key)
			}
			_, after, more := strings.Cut(r.stderr, "--after=")
			if !more {
				break
			}
			if pages > len(want) {
				t.Fatalf("list keeps printing pages: %v", paged)
			}
			after, _, _ = strings.Cut(after, " ")
			args = []string{"--json", "list", "--scope", scope, "--limit", "2", "--after", after}
		}
		if !slices.Equal(paged, want) {
			t.Errorf("paged list: %v, want %v", paged, want)
		}
		everything := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--limit", "2", "--all").mustCode(t, exitOK))
		if len(everything) != 2*len(want) {
			t.Errorf("list --all: %d records, want %d", len(everything), 2*len(want))
		}

		// By age: nothing was written an hour ago, until a record is aged.
		if old := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--older-than", "1h").mustCode(t, exitOK)); len(old) != 0 {
			t.Errorf("list --older-than 1h: %+v, want none", old)
		}
		if fx.age != nil {
			fx.age(t, scope, keyFailed, 2*time.Hour)
			old := jsonLines[recordView](t, fx.cli(t, nil, "--json", "list", "--older-than", "1h").mustCode(t, exitOK))
			if len(old) != 1 || old[0].Key != keyFailed || old[0].Scope != scope {
				t.Errorf("list --older-than 1h after ageing %s: %+v", keyFailed, old)
			}
		}

		table := fx.cli(t, nil, "list", "--scope", scope).mustCode(t, exitOK)
		lines := strings.Split(strings.TrimSpace(table.stdout), "\n")
		if len(lines) != len(want)+1 || !strings.HasPrefix(lines[0], "SCOPE") || !strings.Contains(lines[0], "EXPIRES") {
			t.Errorf("list table:\n%s", table.stdout)
		}
		if !strings.Contains(table.stdout, "card declined") || !strings.Contains(table.stdout, "expired ") {
			t.Errorf("list table lacks the cached error or an expired record:\n%s", table.stdout)
		}
	})
}

// TestStats counts the records in every state, and finds the oldest lease
// and the oldest expired record.
func TestStats(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		s := seed(t, fx.st, scope)
		begin(t, fx.st, "emails", "later-lease", long) // created after payments/live

		v := jsonObject[statsView](t, fx.cli(t, nil, "--json", "stats", "--page-size", "2").mustCode(t, exitOK))
		stored := len(fx.storedKeys()) + 1
		expired := 1 // the dead lease
		if !fx.nativeExpiry {
			expired++ // the expired success, until cleanup removes it
		}
		if v.Records != stored || v.Expired != expired || v.Live != stored-expired {
			t.Errorf("stats: %d records, %d live, %d expired; want %d, %d, %d", v.Records, v.Live, v.Expired, stored, stored-expired, expired)
		}
		got := map[string]countEntry{}
		for _, c := range v.Counts {
			got[c.Scope+"/"+c.Status] = c
		}
		wantCounts := map[string]countEntry{
			"emails/in_progress":      {Scope: "emails", Status: "in_progress", Live: 1},
			"payments/in_progress":    {Scope: scope, Status: "in_progress", Live: 1, Expired: 1},
			"payments/succeeded":      {Scope: scope, Status: "succeeded", Live: 1, Expired: expired - 1},
			"payments/cached_failure": {Scope: scope, Status: "cached_failure", Live: 1},
			"payments/retryable":      {Scope: scope, Status: "retryable", Live: 1},
		}
		if len(got) != len(wantCounts) {
			t.Errorf("stats counts: %+v, want %+v", v.Counts, wantCounts)
		}
		for k, want := range wantCounts {
			if got[k] != want {
				t.Errorf("stats count %s: %+v, want %+v", k, got[k], want)
			}
		}
		if l := v.OldestInProgress; l == nil || l.Scope != scope || l.Key != keyLive || l.Token != s.liveLease.Token {
			t.Errorf("oldest in-progress lease: %+v, want payments/live", l)
		}
		e := v.OldestExpired
		if e == nil || e.Scope != scope || (e.Key != keyDeadLease && e.Key != keyExpiredSuccess) {
			t.Fatalf("oldest expired record: %+v", e)
		}
		if lag, err := time.ParseDuration(v.CleanupLag); err != nil || lag < 0 || v.CleanupLag != e.ExpiredFor {
			t.Errorf("cleanup lag %q (%v), oldest expired for %q", v.CleanupLag, err, e.ExpiredFor)
		}
		if hasGauge := v.StoreCleanupLag != ""; hasGauge != strings.HasPrefix(fx.name, "postgres") {
			t.Errorf("store cleanup lag %q on %s", v.StoreCleanupLag, fx.name)
		}

		table := fx.cli(t, nil, "stats", "--scope", scope).mustCode(t, exitOK).stdout
		for _, want := range []string{"SCOPE", "payments  in_progress", "oldest in-progress lease", "payments/live", "cleanup lag", "expired and not yet removed"} {
			if !strings.Contains(table, want) {
				t.Errorf("stats table lacks %q:\n%s", want, table)
			}
		}
		if strings.Contains(table, "emails") {
			t.Errorf("stats --scope payments shows another scope:\n%s", table)
		}
	})
}

// TestReleaseStuckKey: a key held by a worker that will never finish stays
// held; release refuses its live lease without --force, and with --force
// frees it, so that the next delivery executes and the stale holder can no
// longer record anything.
func TestReleaseStuckKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		stuck := begin(t, fx.st, scope, "order-1", long)
		if d := decide(t, fx.st, scope, "order-1").Decision; d != store.DecisionHeld {
			t.Fatalf("a delivery of the stuck key: %v, want held", d)
		}

		r := fx.cli(t, nil, "release", "--yes", "--scope", scope, "--key", "order-1").mustCode(t, exitRefused)
		if !strings.Contains(r.stderr, "live lease") || !strings.Contains(r.stderr, "--force") || r.stdout != "" {
			t.Errorf("release of a live lease: stdout %q, stderr %q", r.stdout, r.stderr)
		}
		if rec, err := fx.st.Get(t.Context(), scope, "order-1"); err != nil || rec.Token != stuck.Token {
			t.Fatalf("after the refused release: %+v, %v; want the lease untouched", rec, err)
		}

		r = fx.cli(t, nil, "--json", "release", "--force", "--yes", "--scope", scope, "--key", "order-1").mustCode(t, exitOK)
		out := jsonObject[releaseView](t, r)
		if out != (releaseView{Action: "released", Scope: scope, Key: "order-1", Status: "in_progress", Token: stuck.Token, Attempt: 1, Forced: true}) {
			t.Errorf("release printed %+v", out)
		}

		next := decide(t, fx.st, scope, "order-1")
		if next.Decision != store.DecisionExecute || next.Claim.Token == stuck.Token {
			t.Fatalf("the next delivery after release: %+v, want execute under a new token", next)
		}
		err := fx.st.Complete(t.Context(), stuck, store.Completion{Status: store.StatusSucceeded, TTL: long})
		if !errors.Is(err, store.ErrLeaseLost) {
			t.Errorf("the stale holder's Complete: %v, want ErrLeaseLost", err)
		}
	})
}

// TestReleaseCachedFailure: a poison message's cached failure is replayed
// until released; after release (confirmed on stdin) the next delivery
// executes from attempt 1.
func TestReleaseCachedFailure(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		seed(t, fx.st, scope)
		if d := decide(t, fx.st, scope, keyFailed); d.Decision != store.DecisionReplay || d.Record.Status != store.StatusCachedFailure {
			t.Fatalf("a delivery of the failed key: %+v, want the cached failure replayed", d)
		}

		r := fx.cli(t, strings.NewReader("y\n"), "release", "--scope", scope, "--key", keyFailed).mustCode(t, exitOK)
		if !strings.Contains(r.stderr, "[y/N]") || !strings.Contains(r.stdout, "released payments/failed (was cached_failure") {
			t.Errorf("release: stdout %q, stderr %q", r.stdout, r.stderr)
		}
		next := decide(t, fx.st, scope, keyFailed)
		if next.Decision != store.DecisionExecute || next.Claim.Attempt != 1 {
			t.Errorf("the next delivery after release: %+v, want execute at attempt 1", next)
		}

		// A released key (a retryable failure) loses its attempt count.
		if _, err := fx.st.Get(t.Context(), scope, keyRetryable); err != nil {
			t.Fatal(err)
		}
		fx.cli(t, nil, "release", "-y", "--scope", scope, "--key", keyRetryable).mustCode(t, exitOK)
		if next := decide(t, fx.st, scope, keyRetryable); next.Decision != store.DecisionExecute || next.Claim.Attempt != 1 {
			t.Errorf("after releasing a retryable key: %+v, want execute at attempt 1", next)
		}
	})
}

// TestReleaseRefusals: release changes nothing unless confirmed, for a
// success without --force, and when the key changed after it was shown.
func TestReleaseRefusals(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		seed(t, fx.st, scope)
		for _, answer := range []string{"n\n", "\n", "", "maybe\n"} {
			r := fx.cli(t, strings.NewReader(answer), "release", "--scope", scope, "--key", keyFailed).mustCode(t, exitRefused)
			if !strings.Contains(r.stderr, "not confirmed") {
				t.Errorf("answer %q: stderr %q", answer, r.stderr)
			}
		}
		if _, err := fx.st.Get(t.Context(), scope, keyFailed); err != nil {
			t.Fatalf("the declined key is gone: %v", err)
		}

		r := fx.cli(t, nil, "release", "--yes", "--scope", scope, "--key", keySucceeded).mustCode(t, exitRefused)
		if !strings.Contains(r.stderr, "succeeded") || !strings.Contains(r.stderr, "--force") {
			t.Errorf("release of a success: stderr %q", r.stderr)
		}
		if _, err := fx.st.Get(t.Context(), scope, keySucceeded); err != nil {
			t.Fatalf("the refused success is gone: %v", err)
		}

		if fx.file != nil {
			// The CLI holds the file while the operator reads the question:
			// no delivery can take the key meanwhile.
			answer := &onceReader{f: func() string {
				st, err := filestore.New(filestore.Options{Path: fx.file.path, OpenTimeout: 50 * time.Millisecond, CleanupInterval: -1})
				if err == nil {
					st.Close()
				}
				if !errors.Is(err, filestore.ErrLocked) {
					t.Errorf("opening the file while the CLI asks: %v, want filestore.ErrLocked", err)
				}
				return "y\n"
			}}
			fx.cli(t, answer, "release", "--scope", scope, "--key", keyRetryable).mustCode(t, exitOK)
		} else {
			// The key is taken by a new delivery while the operator reads the
			// question: the delete, fenced by the shown token, changes nothing.
			var taken store.Claim
			answer := &onceReader{f: func() string {
				taken = decide(t, fx.st, scope, keyRetryable).Claim
				return "y\n"
			}}
			r = fx.cli(t, answer, "release", "--scope", scope, "--key", keyRetryable).mustCode(t, exitRefused)
			if !strings.Contains(r.stderr, "changed since it was read") {
				t.Errorf("release of a key that changed: stderr %q", r.stderr)
			}
			if rec, err := fx.st.Get(t.Context(), scope, keyRetryable); err != nil || rec.Token != taken.Token || rec.Status != store.StatusInProgress {
				t.Errorf("the new delivery's lease: %+v, %v; want it untouched (token %d)", rec, err, taken.Token)
			}
		}

		for _, key := range []string{keyDeadLease, "never-seen"} {
			r := fx.cli(t, nil, "release", "--yes", "--force", "--scope", scope, "--key", key).mustCode(t, exitNotFound)
			if !strings.Contains(r.stderr, "nothing to release") {
				t.Errorf("release %s: stderr %q", key, r.stderr)
			}
		}
	})
}

// onceReader is a stdin that calls f when it is first read, and then reads
// what f returned.
type onceReader struct {
	f    func() string
	rest *strings.Reader
}

func (o *onceReader) Read(p []byte) (int, error) {
	if o.rest == nil {
		o.rest = strings.NewReader(o.f())
	}
	return o.rest.Read(p)
}

// TestPurge: a dry run by default that deletes nothing; for real, in
// batches, fenced, skipping live leases unless --force.
func TestPurge(t *testing.T) {
	forEachStore(t, func(t *testing.T, fx *fixture) {
		seed(t, fx.st, scope)
		seed(t, fx.st, "emails")
		stored := fx.storedKeys()

		r := fx.cli(t, nil, "purge", "--scope", scope).mustCode(t, exitOK)
		if !strings.Contains(r.stdout, "would_delete") || !strings.Contains(r.stdout, "skipped_live_lease") ||
			!strings.Contains(r.stdout, "dry run: "+strconv.Itoa(len(stored)-1)+" of "+strconv.Itoa(len(stored))+" matching records would be deleted") {
			t.Errorf("dry run:\n%s", r.stdout)
		}
		if got := listAll(t, fx.st, scope); len(got) != len(stored) {
			t.Fatalf("the dry run deleted records: %d left of %d", len(got), len(stored))
		}

		r = fx.cli(t, nil, "--json", "purge", "--scope", scope, "--dry-run=false", "--batch", "2").mustCode(t, exitOK)
		lines := jsonLines[purgeTestLine](t, r)
		sum := lines[len(lines)-1]
		if sum.Action != "summary" || sum.DryRun || sum.Matched != len(stored) || sum.Deleted != len(stored)-1 ||
			sum.SkippedLive != 1 || sum.Batches != (len(stored)+1)/2 {
			t.Errorf("purge summary: %+v", sum)
		}
		for _, l := range lines[:len(lines)-1] {
			want := actionDeleted
			if l.Key == keyLive {
				want = actionSkippedLive
			}
			if l.Action != want || l.Scope != scope {
				t.Errorf("purge line %+v, want action %s", l, want)
			}
		}
		if got := listAll(t, fx.st, scope); len(got) != 1 || got[keyLive].Token == 0 {
			t.Errorf("after purge: %v, want only the live lease", got)
		}
		if got := listAll(t, fx.st, "emails"); len(got) != len(stored) {
			t.Errorf("purge --scope payments deleted from emails: %d left", len(got))
		}

		// By status, and live leases with --force.
		r = fx.cli(t, nil, "purge", "--status", "cached_failure", "--dry-run=false").mustCode(t, exitOK)
		if !strings.Contains(r.stdout, "deleted 1 of 1 matching records in 1 batches") {
			t.Errorf("purge --status cached_failure:\n%s", r.stdout)
		}
		if _, err := fx.st.Get(t.Context(), "emails", keyFailed); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("emails/failed after purge --status cached_failure: %v", err)
		}
		fx.cli(t, nil, "purge", "--status", "in_progress", "--force", "--dry-run=false").mustCode(t, exitOK)
		if left := listAll(t, fx.st, scope); len(left) != 0 {
			t.Errorf("after purging in-progress records with --force: %v", left)
		}
		if next := decide(t, fx.st, scope, keyLive); next.Decision != store.DecisionExecute {
			t.Errorf("the purged lease's next delivery: %v, want execute", next.Decision)
		}

		// By age.
		if fx.age != nil {
			// Retention is thought of in days: --older-than takes them.
			fx.age(t, "emails", keySucceeded, 50*time.Hour)
			r = fx.cli(t, nil, "--json", "purge", "--older-than", "2d", "--dry-run=false").mustCode(t, exitOK)
			lines := jsonLines[purgeTestLine](t, r)
			if len(lines) != 2 || lines[0].Key != keySucceeded || lines[0].Action != actionDeleted || lines[1].Deleted != 1 {
				t.Errorf("purge --older-than 2d: %+v", lines)
			}
		}

		fx.cli(t, nil, "purge").mustCode(t, exitUsage)
	})
}

// purgeTestLine decodes both kinds of purge's JSON lines.
type purgeTestLine struct {
	Action      string `json:"action"`
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	DryRun      bool   `json:"dry_run"`
	Matched     int    `json:"matched"`
	Deleted     int    `json:"deleted"`
	SkippedLive int    `json:"skipped_live_lease"`
	Batches     int    `json:"batches"`
}

// TestMigrate creates the PostgreSQL table, then finds nothing to do; Redis
// has nothing to migrate.
func TestMigrate(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Pool(t)
		flags := postgresFlags(testenv.Schema(t, pool))
		r := runCLI(t, nil, append(flags, "list")...).mustCode(t, exitNotFound)
		if !strings.Contains(r.stderr, `"oncemill migrate"`) {
			t.Errorf("list before migrate: %q", r.stderr)
		}
		r = runCLI(t, nil, append(flags, "migrate")...).mustCode(t, exitOK)
		if !strings.Contains(r.stdout, "migrated postgres") || !strings.Contains(r.stdout, "from schema version 0 to") {
			t.Errorf("first migrate: %q", r.stdout)
		}
		m := jsonObject[migration](t, runCLI(t, nil, append(flags, "--json", "migrate")...).mustCode(t, exitOK))
		if m.Changed || m.From != m.To || m.To == 0 {
			t.Errorf("second migrate: %+v, want no change", m)
		}
		runCLI(t, nil, append(flags, "list")...).mustCode(t, exitOK)
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		flags := []string{"--store=mysql", "--mysql-dsn=" + testenv.MariaDBDatabase(t)}
		r := runCLI(t, nil, append(flags, "list")...).mustCode(t, exitNotFound)
		if !strings.Contains(r.stderr, `"oncemill migrate"`) || !strings.Contains(r.stderr, "--mysql-table") {
			t.Errorf("list before migrate: %q", r.stderr)
		}
		m := jsonObject[migration](t, runCLI(t, nil, append(flags, "--json", "migrate")...).mustCode(t, exitOK))
		if !m.Changed || m.From != 0 || m.To == 0 {
			t.Errorf("first migrate: %+v, want from 0 to the schema version", m)
		}
		m = jsonObject[migration](t, runCLI(t, nil, append(flags, "--json", "migrate")...).mustCode(t, exitOK))
		if m.Changed || m.From != m.To || m.To == 0 {
			t.Errorf("second migrate: %+v, want no change", m)
		}
		runCLI(t, nil, append(flags, "list")...).mustCode(t, exitOK)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		fx := newRedisFixture(t)
		r := fx.cli(t, nil, "migrate").mustCode(t, exitOK)
		if !strings.Contains(r.stdout, "nothing to migrate") {
			t.Errorf("migrate on redis: %q", r.stdout)
		}
	})
}

// TestUsageAndErrors: exit codes of bad input and unreachable stores.
func TestUsageAndErrors(t *testing.T) {
	t.Parallel()
	help := runCLI(t, nil, "--help").mustCode(t, exitOK)
	for _, cmd := range []string{"inspect", "list", "stats", "release", "purge", "migrate", "--json", "ONCEMILL_POSTGRES_DSN"} {
		if !strings.Contains(help.stdout, cmd) {
			t.Errorf("--help lacks %q:\n%s", cmd, help.stdout)
		}
	}
	if r := runCLI(t, nil, "release", "--help").mustCode(t, exitOK); !strings.Contains(r.stdout, "--force") {
		t.Errorf("release --help:\n%s", r.stdout)
	}
	if r := runCLI(t, nil, "inspect", "--help").mustCode(t, exitOK); !strings.Contains(r.stdout, "--uuid") || !strings.Contains(r.stdout, "SCANs every key") {
		t.Errorf("inspect --help does not say what --uuid costs:\n%s", r.stdout)
	}
	for _, args := range [][]string{
		{},
		{"--store=postgres", "frobnicate"},
		{"--store=cassandra", "list"},
		{"--store=postgres", "list", "--status", "stuck"},
		{"--store=postgres", "list", "--limit", "0"},
		{"--store=postgres", "inspect", "--scope=only-scope"},
		{"--store=postgres", "inspect", "payments", "order-42"},
		{"--store=postgres", "release", "--key=k"},
		{"--store=postgres", "inspect"},
		{"--store=postgres", "inspect", "--uuid", "u", "--scope=s", "--key=k"},
		{"--store=postgres", "purge", "--batch", "0", "--scope", "x"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage || r.stderr == "" {
			t.Errorf("%q: exit %d, stderr %q; want %d and a message", args, r.code, r.stderr, exitUsage)
		}
	}
	pg := runCLI(t, nil, "--store=postgres", "--postgres-dsn=postgres://oncemill:secret@127.0.0.1:1/none?connect_timeout=5", "stats").mustCode(t, exitError)
	if !strings.Contains(pg.stderr, "unreachable") || strings.Contains(pg.stderr, "secret") {
		t.Errorf("unreachable PostgreSQL: %q", pg.stderr)
	}
	rd := runCLI(t, nil, "--store=redis", "--redis-addr=127.0.0.1:1", "stats").mustCode(t, exitError)
	if !strings.Contains(rd.stderr, "unreachable") {
		t.Errorf("unreachable Redis: %q", rd.stderr)
	}
}

// TestEnvironment: the ONCEMILL_* variables configure the store like the
// flags; a flag wins over its variable.
func TestEnvironment(t *testing.T) {
	c := newRedisClient(t)
	prefix := newRedisPrefix(t, c)
	fx := newRedisFixture(t)
	begin(t, fx.st, scope, "from-flags", long)

	t.Setenv("ONCEMILL_STORE", "redis")
	t.Setenv("ONCEMILL_REDIS_ADDR", testenv.RedisAddr())
	t.Setenv("ONCEMILL_REDIS_PREFIX", prefix)
	r := runCLI(t, nil, "--json", "list").mustCode(t, exitOK)
	if r.stdout != "" {
		t.Errorf("list of the empty prefix %s: %q", prefix, r.stdout)
	}
	r = runCLI(t, nil, "--json", "--redis-prefix", fx.prefix, "list").mustCode(t, exitOK)
	if got := jsonLines[recordView](t, r); len(got) != 1 || got[0].Key != "from-flags" {
		t.Errorf("list with the flag over the variable: %+v", got)
	}
	t.Setenv("ONCEMILL_STORE", "mongodb")
	runCLI(t, nil, "list").mustCode(t, exitUsage)
}

var _ io.Reader = (*onceReader)(nil)

// inspect --messages shows the produced messages a success stored, as the
// pipeline encoded them, on every store.
func TestInspectShowsProducedMessages(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, fx *fixture) {
		r, err := receiver.New(fx.st).WithScope("orders").Build()
		if err != nil {
			t.Fatal(err)
		}
		h := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
			out := message.NewMessage("invoice-7", []byte(`{"invoice":7}`))
			out.Metadata.Set("order", m.UUID)
			return []*message.Message{out}, nil
		})
		if _, err := h(message.NewMessage("order-7", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
		v := jsonObject[inspectView](t, fx.cli(t, nil, "--json", "inspect", "--messages", "--scope", "orders", "--key", "order-7").mustCode(t, exitOK))
		if len(v.Messages) != 1 || v.Messages[0].UUID != "invoice-7" || v.Messages[0].Payload != `{"invoice":7}` || v.Messages[0].Metadata["order"] != "order-7" {
			t.Fatalf("inspect --json --messages: %+v", v.Messages)
		}
		table := fx.cli(t, nil, "inspect", "--messages", "--scope", "orders", "--key", "order-7").mustCode(t, exitOK).stdout
		if !strings.Contains(table, "1 produced message,") || !strings.Contains(table, `uuid invoice-7, 13 bytes: {"invoice":7}`) || !strings.Contains(table, "order: order-7") {
			t.Fatalf("inspect --messages does not show the produced message:\n%s", table)
		}
	})
}

// An operator pointed at a schema the workers do not use is told which flags
// name the right one, once, with the "oncemill:" prefix once; nothing is
// created there.
func TestMissingTableSaysWhatToPass(t *testing.T) {
	t.Parallel()
	schema := "oncemill_absent_" + strings.ToLower(rand.Text()[:8])
	for _, cmd := range [][]string{{"list"}, {"stats"}, {"inspect", "--scope=s", "--key=k"}} {
		r := runCLI(t, nil, append(postgresFlags(schema), cmd...)...).mustCode(t, exitNotFound)
		if !strings.Contains(r.stderr, "--postgres-schema") || !strings.Contains(r.stderr, `"oncemill migrate"`) ||
			!strings.HasPrefix(r.stderr, "oncemill: ") || strings.Contains(r.stderr, "oncemill: oncemill:") {
			t.Errorf("%v: stderr %q, want one oncemill: prefix and the flags that name the workers' table", cmd, r.stderr)
		}
	}
	var exists bool
	if err := testenv.Pool(t).QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
		t.Fatalf("schema %s exists afterwards (%v): looking must not create it", schema, err)
	}
}

// Every command that names records takes them by the same flags, --scope
// (and --key for one record); a flag it does not take, the positional form
// of earlier versions and a misspelt flag are answered with real commands
// and flags.
func TestOneArgumentStyle(t *testing.T) {
	t.Parallel()
	fx := newPostgresFixture(t, postgres.LayoutDelete)
	seed(t, fx.st, scope)
	for _, args := range [][]string{
		{"inspect", "--scope=" + scope, "--key=" + keyFailed},
		{"inspect", "--uuid=none", "--scope=" + scope},
		{"list", "--scope=" + scope},
		{"stats", "--scope=" + scope},
		{"purge", "--scope=" + scope},
		{"release", "--scope=" + scope, "--key=" + keyFailed, "--yes"},
	} {
		if r := fx.cli(t, nil, args...); r.code == exitUsage {
			t.Errorf("%q: a usage error: %s", args, r.stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"inspect", scope, keyFailed}, []string{"oncemill inspect takes the scope and key as flags: --scope=SCOPE --key=KEY", `"oncemill inspect --help"`}},
		{[]string{"release", "--yes", scope, keyFailed}, []string{"oncemill release takes the scope and key as flags", `"oncemill release --help"`}},
		{[]string{"inspect", "--scop=" + scope, "--key=k"}, []string{`did you mean "--scope"?`}},
		{[]string{"list", "--key=k"}, []string{"--key is a flag of: oncemill inspect, release"}},
		{[]string{"migrate", "--scope=" + scope}, []string{"--scope is a flag of: oncemill inspect, list, stats, release, purge"}},
		{[]string{"inspect", "--scope=" + scope}, []string{"missing flag --key=KEY (with --scope=SCOPE), or --uuid=UUID"}},
		{[]string{"release", "--key=k"}, []string{"missing flag --scope=SCOPE"}},
		{[]string{"watermark", "move", "--grop=g"}, []string{`did you mean "--group"?`, `"oncemill watermark move --help"`}},
	} {
		r := fx.cli(t, nil, tc.args...).mustCode(t, exitUsage)
		for _, want := range tc.want {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("%q: stderr %q lacks %q", tc.args, r.stderr, want)
			}
		}
	}
}
