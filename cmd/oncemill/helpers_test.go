package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
	"github.com/oncemill/oncemill/store/mysql"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/tiered"
)

// The services the tests use are internal/testenv's: the development and
// CI PostgreSQL and Redis, or the ONCEMILL_* variables. An unreachable
// service fails the test: these tests never skip.

// adminStore is what the tests drive: the delivery path to create records
// in every state, and the operator's view to check what the CLI did.
type adminStore interface {
	store.Store
	store.Admin
}

// fixture is one store under test and the flags that point the CLI at it.
type fixture struct {
	name  string
	st    adminStore
	flags []string
	// prefix is the Redis store's key prefix (Redis only).
	prefix string
	// nativeExpiry: the store drops finished records when they expire
	// (Redis), so no expired success is ever listed.
	nativeExpiry bool
	// age moves the last write of a record d into the past (PostgreSQL
	// only; nil for Redis, whose record times are written by the workers).
	age func(t *testing.T, scope, key string, d time.Duration)
	// file is the file store's handle (file only): one process at a time
	// holds the file, so the test lets go of it while the CLI runs.
	file *heldFile
}

// storeNames are the fixtures every forEachStore test runs on:
// postgres-partitioned is PostgreSQL's partitioned layout
// (postgres.LayoutPartitioned), which the CLI reaches with
// --postgres-layout=partitioned.
var storeNames = []string{"postgres", "postgres-partitioned", "mysql", "redis", "tiered", "file"}

func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	switch name {
	case "postgres":
		return newPostgresFixture(t, postgres.LayoutDelete)
	case "postgres-partitioned":
		return newPostgresFixture(t, postgres.LayoutPartitioned)
	case "mysql":
		return newMySQLFixture(t)
	case "redis":
		return newRedisFixture(t)
	case "tiered":
		return newTieredFixture(t)
	case "file":
		return newFileFixture(t)
	}
	t.Fatalf("no fixture for store %q", name)
	return nil
}

// forEachStore runs f as a parallel subtest on a fresh fixture of each store.
func forEachStore(t *testing.T, f func(t *testing.T, fx *fixture)) {
	t.Helper()
	for _, name := range storeNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newFixture(t, name))
		})
	}
}

func postgresFlags(schema string) []string {
	return []string{"--store=postgres", "--postgres-dsn=" + testenv.PostgresDSN(), "--postgres-schema=" + schema, "--postgres-table=oncemill_records"}
}

func newPostgresFixture(t *testing.T, layout postgres.Layout) *fixture {
	t.Helper()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, Layout: layout})
	if err != nil {
		t.Fatalf("postgres.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	qualified := pgx.Identifier{schema, "oncemill_records"}.Sanitize()
	name, flags := "postgres", postgresFlags(schema)
	if layout == postgres.LayoutPartitioned {
		name, flags = "postgres-partitioned", append(flags, "--postgres-layout=partitioned")
	}
	return &fixture{
		name:  name,
		st:    st,
		flags: flags,
		age: func(t *testing.T, scope, key string, d time.Duration) {
			t.Helper()
			tag, err := pool.Exec(t.Context(), "UPDATE "+qualified+
				" SET updated_at = updated_at - $3 * interval '1 microsecond' WHERE scope = $1 AND key = $2", scope, key, d.Microseconds())
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("ageing %s/%s by %v: %v (%d rows)", scope, key, d, err, tag.RowsAffected())
			}
		},
	}
}

// newMySQLFixture is a migrated MySQL store in a database of the test's
// own on the local MariaDB.
func newMySQLFixture(t *testing.T) *fixture {
	t.Helper()
	dsn := testenv.MariaDBDatabase(t)
	db := testenv.MariaDB(t, dsn)
	st, err := mysql.New(db, mysql.Options{CleanupInterval: -1})
	if err != nil {
		t.Fatalf("mysql.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &fixture{
		name:  "mysql",
		st:    st,
		flags: []string{"--store=mysql", "--mysql-dsn=" + dsn, "--mysql-table=oncemill_records"},
		age: func(t *testing.T, scope, key string, d time.Duration) {
			t.Helper()
			res, err := db.ExecContext(t.Context(), "UPDATE oncemill_records SET updated_at = updated_at - INTERVAL ? MICROSECOND WHERE scope = ? AND `key` = ?",
				d.Microseconds(), scope, key)
			if n, _ := res.RowsAffected(); err != nil || n != 1 {
				t.Fatalf("ageing %s/%s by %v: %v (%d rows)", scope, key, d, err, n)
			}
		},
	}
}

func newRedisClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		t.Fatalf("Redis at %s is unreachable: %v; start it with: %s", testenv.RedisAddr(), err, testenv.StartRedis)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newRedisPrefix returns a prefix for this test alone and removes its keys
// when the test ends.
func newRedisPrefix(t *testing.T, c *redis.Client) string {
	t.Helper()
	prefix := "oncemilltest:cli" + rand.Text()[:12]
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Unlink(ctx, iter.Val()).Err(); err != nil {
				t.Errorf("removing test key %q: %v", iter.Val(), err)
			}
		}
		if err := iter.Err(); err != nil {
			t.Errorf("removing the test keys under %q: %v", prefix, err)
		}
	})
	return prefix
}

func redisFlags(prefix string) []string {
	return []string{"--store=redis", "--redis-addr=" + testenv.RedisAddr(), "--redis-prefix=" + prefix}
}

func newRedisFixture(t *testing.T) *fixture {
	t.Helper()
	c := newRedisClient(t)
	prefix := newRedisPrefix(t, c)
	st, err := redisstore.New(c, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatalf("redis.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &fixture{name: "redis", st: st, flags: redisFlags(prefix), prefix: prefix, nativeExpiry: true}
}

// newTieredFixture is the tiered store: the records in PostgreSQL (as the
// postgres fixture has them), their cache in Redis. Its store keeps no local
// tier, so that what the CLI deletes (a tombstone in Redis) is seen by the
// test's next ClaimLease at once rather than when the invalidation arrives.
func newTieredFixture(t *testing.T) *fixture {
	t.Helper()
	pg := newPostgresFixture(t, postgres.LayoutDelete)
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("Redis at %s is unreachable: %v; start it with: %s", testenv.RedisAddr(), err, testenv.StartRedis)
	}
	prefix := newRedisPrefix(t, c)
	st, err := tiered.New(pg.st.(*postgres.Store), c, tiered.Options{Prefix: prefix, LocalCapacity: -1})
	if err != nil {
		t.Fatalf("tiered.New: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	flags := append([]string{"--store=tiered"}, pg.flags[1:]...)
	flags = append(flags, "--redis-addr="+testenv.RedisAddr(), "--tiered-prefix="+prefix)
	return &fixture{name: "tiered", st: st, flags: flags, age: pg.age}
}

// heldFile is the test's file store, closed while the CLI has the file and
// opened again afterwards; the file keeps the records and their tokens, so
// that the leases the test holds stay valid.
type heldFile struct {
	*filestore.Store
	path string
}

func (h *heldFile) open(t *testing.T) {
	t.Helper()
	st, err := filestore.New(filestore.Options{Path: h.path, CleanupInterval: -1})
	if err != nil {
		t.Fatalf("filestore.New: %v", err)
	}
	h.Store = st
}

func (h *heldFile) close(t *testing.T) {
	t.Helper()
	if err := h.Store.Close(); err != nil {
		t.Fatalf("closing the file store: %v", err)
	}
}

func fileFlags(path string) []string { return []string{"--store=file", "--file-path=" + path} }

// newFileFixture is a file store in the test's directory. It keeps its
// expired records until a sweep, which neither it nor the CLI runs.
func newFileFixture(t *testing.T) *fixture {
	t.Helper()
	h := &heldFile{path: filepath.Join(t.TempDir(), "oncemill.db")}
	h.open(t)
	t.Cleanup(func() { _ = h.Store.Close() })
	return &fixture{name: "file", st: h, flags: fileFlags(h.path), file: h}
}

// cliRun is one run of the CLI.
type cliRun struct {
	code           int
	stdout, stderr string
}

// runCLI runs the CLI in process with args and stdin.
func runCLI(t *testing.T, stdin io.Reader, args ...string) cliRun {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var out, errb bytes.Buffer
	code := run(t.Context(), args, stdin, &out, &errb)
	return cliRun{code: code, stdout: out.String(), stderr: errb.String()}
}

// cli runs the CLI against the fixture's store.
func (fx *fixture) cli(t *testing.T, stdin io.Reader, args ...string) cliRun {
	t.Helper()
	if fx.file != nil {
		fx.file.close(t)
		defer fx.file.open(t)
	}
	return runCLI(t, stdin, append(append([]string{}, fx.flags...), args...)...)
}

// mustCode fails the test unless r exited with code.
func (r cliRun) mustCode(t *testing.T, code int) cliRun {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

// jsonObject decodes stdout as one JSON object.
func jsonObject[T any](t *testing.T, r cliRun) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
	}
	return v
}

// jsonLines decodes stdout as JSON lines.
func jsonLines[T any](t *testing.T, r cliRun) []T {
	t.Helper()
	var out []T
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, v)
	}
	return out
}

// Durations the seeded records use: long enough never to run out during a
// test, or short enough to be over at once.
const (
	long  = time.Hour
	short = time.Millisecond
)

// The keys of seed, one per state.
const (
	keyLive           = "live"            // in progress, a live lease
	keySucceeded      = "succeeded"       // succeeded, with a stored result
	keyFailed         = "failed"          // a cached failure
	keyRetryable      = "retryable"       // released after a retryable failure
	keyDeadLease      = "dead-lease"      // in progress, its lease expired: a crashed worker's
	keyExpiredSuccess = "expired-success" // succeeded and expired (PostgreSQL keeps it until cleanup)
)

var storedResult = []byte("produced: order-7 shipped")

// seeded is what seed created.
type seeded struct {
	scope     string
	liveLease store.Claim // the lease of keyLive, held by a "worker" that never finishes
}

// seed creates a record in every state under scope through the store's own
// delivery path.
func seed(t *testing.T, st adminStore, scope string) seeded {
	t.Helper()
	s := seeded{scope: scope}
	s.liveLease = begin(t, st, scope, keyLive, long)
	complete(t, st, begin(t, st, scope, keySucceeded, long), store.Completion{Status: store.StatusSucceeded, Result: storedResult, TTL: long})
	complete(t, st, begin(t, st, scope, keyFailed, long), store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "card declined: do not honour", TTL: long})
	if err := st.Release(t.Context(), begin(t, st, scope, keyRetryable, long), store.Completion{Status: store.StatusRetryable, TTL: long}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	begin(t, st, scope, keyDeadLease, short)
	complete(t, st, begin(t, st, scope, keyExpiredSuccess, long), store.Completion{Status: store.StatusSucceeded, TTL: short})
	waitExpired(t, st, scope, keyDeadLease)
	waitExpired(t, st, scope, keyExpiredSuccess)
	return s
}

// begin takes the key with a lease of lease, kept (Retain) for an hour.
func begin(t *testing.T, st adminStore, scope, key string, lease time.Duration) store.Claim {
	t.Helper()
	res, err := st.ClaimLease(t.Context(), store.LeaseRequest{Scope: scope, Key: key, LeaseDuration: lease, Retain: long})
	if err != nil {
		t.Fatalf("ClaimLease %s/%s: %v", scope, key, err)
	}
	if res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease %s/%s: decision %v, want execute", scope, key, res.Decision)
	}
	return res.Claim
}

func complete(t *testing.T, st adminStore, l store.Claim, c store.Completion) {
	t.Helper()
	if err := st.Complete(t.Context(), l, c); err != nil {
		t.Fatalf("Complete %s/%s: %v", l.Scope, l.Key, err)
	}
}

// waitExpired waits until Get no longer sees the record (it has expired by
// the store's clock), failing the test after 30 s.
func waitExpired(t *testing.T, st adminStore, scope, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := st.Get(t.Context(), scope, key)
		if errors.Is(err, store.ErrNotFound) {
			return
		}
		if err != nil {
			t.Fatalf("Get %s/%s: %v", scope, key, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s did not expire within 30s", scope, key)
		}
		time.Sleep(time.Millisecond)
	}
}

// decide runs one delivery's ClaimLease, as the next delivery of the key would.
func decide(t *testing.T, st adminStore, scope, key string) store.ClaimResult {
	t.Helper()
	res, err := st.ClaimLease(t.Context(), store.LeaseRequest{Scope: scope, Key: key, LeaseDuration: long, Retain: long})
	if err != nil {
		t.Fatalf("ClaimLease %s/%s: %v", scope, key, err)
	}
	return res
}

// listAll reads every record of scope through the store.
func listAll(t *testing.T, st adminStore, scope string) map[string]store.Record {
	t.Helper()
	out := map[string]store.Record{}
	req := store.ListRequest{Scope: scope}
	for {
		page, err := st.List(t.Context(), req)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, r := range page.Records {
			out[r.Key] = r
		}
		if page.Next == "" {
			return out
		}
		req.After = page.Next
	}
}

// storedKeys are the keys seed leaves stored in each store: Redis drops an
// expired success by itself.
func (fx *fixture) storedKeys() []string {
	keys := []string{keyDeadLease, keyFailed, keyLive, keyRetryable, keySucceeded}
	if !fx.nativeExpiry {
		keys = append(keys, keyExpiredSuccess)
	}
	return keys
}
