package main

// These tests run the worker and cmd/oncemill as built binaries, the way a
// user runs them, against the real Redis and PostgreSQL, each configured by
// the ONCEMILL_* variables the two read alike.

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/testenv"
)

var built struct {
	once sync.Once
	dir  string
	out  []byte
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binaries builds example-worker and oncemill once for the package's tests
// and returns the directory that holds them.
func binaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "example-worker-test-"); built.err == nil {
			built.out, built.err = exec.Command("go", "build", "-o", built.dir+string(filepath.Separator), ".", "../oncemill").CombinedOutput()
		}
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.dir
}

// run runs one of the binaries with the environment's ONCEMILL_* variables
// replaced by env, and returns its stdout; a non-zero exit fails the test.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binaries(t), name), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ONCEMILL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s with %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), env, err, out, stderr.String())
	}
	return string(out)
}

// redisDB is the Redis database the tests put records in: not 0, the
// database of a host:port address.
const redisDB = 9

// redisURL returns the ONCEMILL_REDIS_ADDR of database redisDB, and a
// client of that database and one of database 0. The keys of prefix are
// removed from both when the test ends.
func redisURL(t *testing.T, prefix string) (string, *goredis.Client, *goredis.Client) {
	t.Helper()
	url := "redis://" + testenv.RedisAddr() + "/" + strconv.Itoa(redisDB)
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	db, db0 := goredis.NewClient(opts), goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr()})
	t.Cleanup(func() {
		for _, c := range []*goredis.Client{db, db0} {
			for _, k := range scan(t, c, prefix) {
				c.Del(context.Background(), k)
			}
			_ = c.Close()
		}
	})
	return url, db, db0
}

func scan(t *testing.T, c *goredis.Client, prefix string) []string {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+":*").Result()
	if err != nil {
		t.Fatalf("Redis at %s is unreachable: %v; start it with: %s", testenv.RedisAddr(), err, testenv.StartRedis)
	}
	return keys
}

func testPrefix() string { return "example-worker-test-" + strings.ToLower(rand.Text()[:10]) }

// ONCEMILL_REDIS_ADDR as a redis:// URL, the form cmd/oncemill takes too:
// the demo's records land in the URL's database.
func TestRedisURLPicksTheDatabase(t *testing.T) {
	prefix := testPrefix()
	url, db, db0 := redisURL(t, prefix)
	run(t, []string{"ONCEMILL_REDIS_ADDR=" + url, "ONCEMILL_REDIS_PREFIX=" + prefix}, "example-worker", "--store=redis", "--count=50", "--partitions=2")
	if n := len(scan(t, db, prefix)); n < 50 {
		t.Errorf("database %d holds %d keys of prefix %s, want the records of the 50 payments", redisDB, n, prefix)
	}
	if keys := scan(t, db0, prefix); len(keys) > 0 {
		t.Errorf("database 0 holds %d keys of prefix %s, e.g. %s: want them all in database %d", len(keys), prefix, keys[0], redisDB)
	}
}

var (
	statsSucceeded = regexp.MustCompile(`(?m)^payments +succeeded +(\d+) +0$`)
	statsCached    = regexp.MustCompile(`(?m)^payments +cached_failure +(\d+) +0$`)
	// The ERROR column of a cached failure: the demo's 4th and 54th payments
	// are invalid. The submatches are the run and the payment's number.
	invalidPayment = regexp.MustCompile(`payment p-(\S+)-(0000(?:04|54)):`)
)

// The runbook (docs/operations.md) looks at the scope payments: after two
// demo runs on one shared store, its commands, run as written with the
// store named by the same ONCEMILL_* variables, find both runs' records, and
// the second run charged its own payments rather than replaying the first's.
func TestRunbookFindsTheDemosRecords(t *testing.T) {
	stores := map[string]func(t *testing.T) []string{
		"redis": func(t *testing.T) []string {
			prefix := testPrefix()
			url, _, _ := redisURL(t, prefix)
			return []string{"ONCEMILL_STORE=redis", "ONCEMILL_REDIS_ADDR=" + url, "ONCEMILL_REDIS_PREFIX=" + prefix}
		},
		"postgres": func(t *testing.T) []string {
			return []string{"ONCEMILL_STORE=postgres", "ONCEMILL_POSTGRES_DSN=" + testenv.PostgresDSN(),
				"ONCEMILL_POSTGRES_SCHEMA=" + testenv.Schema(t, testenv.Pool(t))}
		},
		"mysql": func(t *testing.T) []string {
			return []string{"ONCEMILL_STORE=mysql", "ONCEMILL_MYSQL_DSN=" + testenv.MariaDBDatabase(t)}
		},
		// The worker lets go of the file when it exits, and the CLI opens it.
		"file": func(t *testing.T) []string {
			return []string{"ONCEMILL_STORE=file", "ONCEMILL_FILE_PATH=" + filepath.Join(t.TempDir(), "oncemill.db")}
		},
	}
	for name, setup := range stores {
		t.Run(name, func(t *testing.T) {
			env := setup(t)
			for i := range 2 {
				out := run(t, env, "example-worker", "--store="+name, "--count=100", "--partitions=2")
				if !strings.Contains(out, " effects=98 ") { // 100 payments, 2 invalid
					t.Errorf("run %d charged other than its 98 valid payments:\n%s", i+1, out)
				}
			}

			stats := run(t, env, "oncemill", "stats", "--scope", "payments")
			if m := statsSucceeded.FindStringSubmatch(stats); m == nil || m[1] != "196" {
				t.Errorf("oncemill stats --scope payments: want 196 live succeeded records (98 per run):\n%s", stats)
			}
			if m := statsCached.FindStringSubmatch(stats); m == nil || m[1] != "4" {
				t.Errorf("oncemill stats --scope payments: want 4 live cached failures (2 per run):\n%s", stats)
			}
			failures := run(t, env, "oncemill", "list", "--status", "cached_failure", "--scope", "payments")
			runs := map[string][]string{}
			for _, m := range invalidPayment.FindAllStringSubmatch(failures, -1) {
				runs[m[1]] = append(runs[m[1]], m[2])
			}
			if len(runs) != 2 {
				t.Errorf("oncemill list --status cached_failure --scope payments: want payments 000004 and 000054 of each of the 2 runs, got %v:\n%s", runs, failures)
			}
			for r, ids := range runs {
				if len(ids) != 2 {
					t.Errorf("run %s: cached failures of payments %v, want 000004 and 000054", r, ids)
				}
			}
		})
	}
}
