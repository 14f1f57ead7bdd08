package main

// Opening the store that --store names. Everything the commands do goes
// through store.Admin, so each store needs only an opener here.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/url"
	"os"
	"strings"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
	"github.com/oncemill/oncemill/store/mysql"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/tiered"
)

// backend is an open store and what the commands need beside store.Admin.
type backend struct {
	admin store.Admin
	// where names the store in messages, without secrets.
	where string
	// now is the time that the store's record times are compared with:
	// PostgreSQL's now() (every PostgreSQL time is the database's), the
	// local clock for Redis (its record times are the workers' clocks).
	now func(ctx context.Context) (time.Time, error)
	// migrate applies the store's migrations and says what it changed.
	migrate func(ctx context.Context) (migration, error)
	// ready reports a store that has no records to look at: a PostgreSQL
	// schema and table that the workers do not use. Nil: always ready.
	ready func(ctx context.Context) error
	// deletesUnreadable: Delete removes a record that Get cannot decode,
	// under any token (store/filestore), so that release --force can free it.
	deletesUnreadable bool
	close             func()
}

// migration is what migrate did.
type migration struct {
	Store  string `json:"store"`
	Target string `json:"target"`
	From   int    `json:"from_version"`
	To     int    `json:"to_version"`
	// FromLayout and ToLayout are the PostgreSQL table's layout before and
	// after ("delete", "partitioned"; empty for no table), so that a
	// conversion at the same schema version shows as a change.
	FromLayout string `json:"from_layout,omitempty"`
	ToLayout   string `json:"to_layout,omitempty"`
	Changed    bool   `json:"changed"`
	Note       string `json:"note,omitempty"`
}

// cleanupLagger is implemented by stores that measure their cleanup lag
// themselves (store/postgres: the oncemill.store.cleanup.lag gauge).
type cleanupLagger interface {
	CleanupLag(ctx context.Context) (time.Duration, error)
}

// libraryDefaultSchema is what postgres.Options.Schema defaults to, for
// messages only (TestDefaultSchemaIsTheLibrarys checks it).
const libraryDefaultSchema = "public"

// open connects to the store the flags name.
func (a *app) open() (*backend, error) {
	ctx, cancel := context.WithTimeout(a.ctx, connectTimeout)
	defer cancel()
	switch a.g.Store {
	case "postgres":
		b, _, err := openPostgres(ctx, a.g)
		return b, err
	case "mysql":
		return openMySQL(ctx, a.g)
	case "redis":
		return openRedis(ctx, a.g)
	case "tiered":
		return openTiered(ctx, a.g, a.stderr)
	case "file":
		return openFile(a.g)
	}
	return nil, usage("--store=%q: use postgres, mysql, redis, tiered or file", a.g.Store)
}

// fileLockWait bounds the wait for the file store's lock: a worker holds
// it as long as it runs, so waiting longer would only delay the message.
const fileLockWait = time.Second

// openFile opens the file store at --file-path, which must exist: the CLI
// reads and deletes records, and an absent file means a mistyped path
// rather than a store to create.
func openFile(g *globals) (*backend, error) {
	if _, err := os.Stat(g.FilePath); errors.Is(err, os.ErrNotExist) {
		return nil, notFound("no file store at %s: pass the file your worker uses with --file-path (ONCEMILL_FILE_PATH)", g.FilePath)
	}
	st, err := filestore.New(filestore.Options{
		Path:            g.FilePath,
		OpenTimeout:     fileLockWait,
		CleanupInterval: -1, // the worker sweeps; this tool deletes only what it is told
	})
	if errors.Is(err, filestore.ErrLocked) {
		return nil, fmt.Errorf("the file store %s is held by another process, most likely the worker that uses it: "+
			"one process at a time opens the file. Stop that worker, run this command, then start the worker again (waited %v for the file)",
			g.FilePath, fileLockWait)
	}
	if err != nil {
		return nil, err
	}
	return &backend{
		admin: st,
		where: "file " + g.FilePath,
		// The record times are those of the worker's clock, on this machine.
		now: func(context.Context) (time.Time, error) { return time.Now(), nil },
		migrate: func(context.Context) (migration, error) {
			return migration{Store: "file", Target: g.FilePath,
				Note: "the file store has no schema: filestore.New writes the file's layout when it creates it"}, nil
		},
		deletesUnreadable: true,
		close:             func() { _ = st.Close() },
	}, nil
}

func openPostgres(ctx context.Context, g *globals) (*backend, *postgres.Store, error) {
	where := redactURL(g.PostgresDSN)
	cfg, err := pgxpool.ParseConfig(g.PostgresDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("--postgres-dsn %s: %w", where, err)
	}
	if !strings.Contains(g.PostgresDSN, "pool_max_conns") {
		cfg.MaxConns = 2 // one command, one statement at a time
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("PostgreSQL at %s is unreachable: %w", where, err)
	}
	layout := postgres.LayoutDelete
	if g.PostgresLayout == "partitioned" {
		layout = postgres.LayoutPartitioned
	}
	st, err := postgres.New(pool, postgres.Options{
		Schema:          g.PostgresSchema,
		Table:           g.PostgresTable,
		Layout:          layout,
		CleanupInterval: -1, // the workers clean; this tool only looks and deletes what it is told
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// An empty --postgres-schema is passed on as the zero Options.Schema, so
	// the library's default decides; the name is only for messages.
	target := cmp.Or(g.PostgresSchema, libraryDefaultSchema) + "." + g.PostgresTable // plain identifiers: New validated them
	table := pgx.Identifier{cmp.Or(g.PostgresSchema, libraryDefaultSchema), g.PostgresTable}.Sanitize()
	return &backend{
		admin: st,
		where: "postgres " + target + " at " + where,
		now: func(ctx context.Context) (time.Time, error) {
			var now time.Time
			if err := pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
				return time.Time{}, fmt.Errorf("reading the database clock: %w", err)
			}
			return now, nil
		},
		ready: func(ctx context.Context) error {
			v, err := st.AppliedVersion(ctx)
			if err == nil && v == 0 {
				return notFound("no oncemill records table %s at %s: pass the schema and table your workers use "+
					"(their postgres.Options.Schema and Table) with --postgres-schema and --postgres-table "+
					"(ONCEMILL_POSTGRES_SCHEMA, ONCEMILL_POSTGRES_TABLE), or create it there with \"oncemill migrate\"", target, where)
			}
			return err
		},
		migrate: func(ctx context.Context) (migration, error) {
			m := migration{Store: "postgres", Target: target}
			var err error
			if m.From, err = st.AppliedVersion(ctx); err != nil {
				return m, err
			}
			if m.FromLayout, err = tableLayout(ctx, pool, table); err != nil {
				return m, err
			}
			if err := st.Migrate(ctx); err != nil {
				return m, err
			}
			if m.To, err = st.AppliedVersion(ctx); err != nil {
				return m, err
			}
			if m.ToLayout, err = tableLayout(ctx, pool, table); err != nil {
				return m, err
			}
			m.Changed = m.From != m.To || m.FromLayout != m.ToLayout
			return m, nil
		},
		close: func() { _ = st.Close(); pool.Close() },
	}, st, nil
}

// openMySQL opens the MySQL or MariaDB store of --mysql-dsn and
// --mysql-table. Its record times are the server's UTC_TIMESTAMP(6).
func openMySQL(ctx context.Context, g *globals) (*backend, error) {
	cfg, err := mysqldriver.ParseDSN(g.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn: %w", err)
	}
	where := cfg.Addr + "/" + cfg.DBName // the DSN without its password
	db, err := sql.Open("mysql", g.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("--mysql-dsn %s: %w", where, err)
	}
	db.SetMaxOpenConns(2) // one command, one statement at a time
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("MySQL at %s is unreachable: %w", where, err)
	}
	st, err := mysql.New(db, mysql.Options{
		Table:           g.MySQLTable,
		CleanupInterval: -1, // the workers clean; this tool only looks and deletes what it is told
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	target := cfg.DBName + "." + g.MySQLTable
	return &backend{
		admin: st,
		where: "mysql " + target + " at " + where,
		now: func(ctx context.Context) (time.Time, error) {
			var us int64
			if err := db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))").Scan(&us); err != nil {
				return time.Time{}, fmt.Errorf("reading the server clock: %w", err)
			}
			return time.UnixMicro(us), nil
		},
		ready: func(ctx context.Context) error {
			v, err := st.AppliedVersion(ctx)
			if err == nil && v == 0 {
				return notFound("no oncemill records table %s at %s: pass the database and table your workers use "+
					"with --mysql-dsn and --mysql-table (ONCEMILL_MYSQL_DSN, ONCEMILL_MYSQL_TABLE), or create it there with \"oncemill migrate\"", target, where)
			}
			return err
		},
		migrate: func(ctx context.Context) (migration, error) {
			m := migration{Store: "mysql", Target: target}
			var err error
			if m.From, err = st.AppliedVersion(ctx); err != nil {
				return m, err
			}
			if err := st.Migrate(ctx); err != nil {
				return m, err
			}
			if m.To, err = st.AppliedVersion(ctx); err != nil {
				return m, err
			}
			m.Changed = m.From != m.To
			return m, nil
		},
		close: func() { _ = st.Close(); _ = db.Close() },
	}, nil
}

func openRedis(ctx context.Context, g *globals) (*backend, error) {
	client, where, err := redisClient(ctx, g)
	if err != nil {
		return nil, err
	}
	st, err := redisstore.New(client, redisstore.Options{Prefix: g.RedisPrefix})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &backend{
		admin: st,
		where: "redis prefix " + g.RedisPrefix + " at " + where,
		now:   func(context.Context) (time.Time, error) { return time.Now(), nil },
		migrate: func(context.Context) (migration, error) {
			return migration{Store: "redis", Target: g.RedisPrefix,
				Note: "Redis has no schema: each record is upgraded to the current layout when it is read"}, nil
		},
		close: func() { _ = st.Close(); _ = client.Close() },
	}, nil
}

// redisClient connects to --redis-addr. Its calls are bounded by their
// contexts (ContextTimeoutEnabled), as the tiered store requires.
func redisClient(ctx context.Context, g *globals) (*redis.Client, string, error) {
	client, where, err := redisClientOf(g)
	if err != nil {
		return nil, "", err
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, "", fmt.Errorf("Redis at %s is unreachable: %w", where, err)
	}
	return client, where, nil
}

// redisClientOf is the client of --redis-addr, not yet used.
func redisClientOf(g *globals) (*redis.Client, string, error) {
	opts := &redis.Options{Addr: g.RedisAddr}
	if strings.Contains(g.RedisAddr, "://") {
		var err error
		if opts, err = redis.ParseURL(g.RedisAddr); err != nil {
			return nil, "", fmt.Errorf("--redis-addr %s: %w", redactURL(g.RedisAddr), err)
		}
	}
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), redactURL(g.RedisAddr), nil
}

// openTiered opens PostgreSQL, the truth, and the tiered store's Redis cache
// in front of it. Releases and purges go through the tiered store, so that
// they reach the caches of every worker (a tombstone and an invalidation);
// with --store=postgres they would not. While Redis is down the commands
// that read still work, from the truth, with a warning on stderr; a release
// or purge fails, as the tiered store refuses one that could not reach the
// caches.
func openTiered(ctx context.Context, g *globals, stderr io.Writer) (*backend, error) {
	b, pg, err := openPostgres(ctx, g)
	if err != nil {
		return nil, err
	}
	client, where, err := redisClientOf(g)
	if err != nil {
		b.close()
		return nil, err
	}
	if err := client.Ping(ctx).Err(); err != nil {
		fmt.Fprintf(stderr, "warning: Redis at %s is unreachable (%v): reading PostgreSQL, the truth; release and purge fail until Redis is back\n", where, err)
	}
	// The CLI keeps no local tier: it reads the truth, and runs too briefly
	// to gain from one.
	st, err := tiered.New(pg, client, tiered.Options{Prefix: g.TieredPrefix, LocalCapacity: -1})
	if err != nil {
		_ = client.Close()
		b.close()
		return nil, err
	}
	closePG := b.close
	b.admin = st
	b.where = "tiered " + b.where + ", cache prefix " + g.TieredPrefix + " at " + where
	b.close = func() { _ = st.Close(); _ = client.Close(); closePG() }
	return b, nil
}

// redactURL hides the password of a URL-shaped address, for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// withStore opens the store, checks that it holds records to look at, runs
// f with it and closes it.
func (a *app) withStore(f func(b *backend) error) error {
	return a.withBackend(func(b *backend) error {
		if b.ready != nil {
			if err := b.ready(a.ctx); err != nil {
				return err
			}
		}
		return f(b)
	})
}

// withBackend opens the store, runs f with it and closes it: for migrate,
// which creates what withStore checks for.
func (a *app) withBackend(f func(b *backend) error) error {
	b, err := a.open()
	if err != nil {
		return err
	}
	defer b.close()
	return f(b)
}

// storeNow is the store's time now, for judging expiry and ages.
func (b *backend) storeNow(ctx context.Context) (time.Time, error) {
	now, err := b.now(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", b.where, err)
	}
	return now, nil
}

// pages yields the pages of req from req.After to the last, or the error
// that ended them: the paging every command that reads records shares.
func (b *backend) pages(ctx context.Context, req store.ListRequest) iter.Seq2[store.ListPage, error] {
	return func(yield func(store.ListPage, error) bool) {
		for {
			page, err := b.admin.List(ctx, req)
			err = b.readFailed(err)
			if !yield(page, err) || err != nil || page.Next == "" {
				return
			}
			req.After = page.Next
		}
	}
}

// readFailed adds to an error of Get or List, on a store whose Delete
// removes a record it cannot decode, how to remove one: the file store's
// List stops at such a record, so one bad record stops list, stats and
// purge until it is gone.
func (b *backend) readFailed(err error) error {
	if err == nil || !b.deletesUnreadable || errors.Is(err, store.ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w; if it names a record that cannot be decoded, delete that one with "+
		"\"oncemill release --scope=SCOPE --key=KEY --force\"", err)
}

// tableLayout is the layout of the records table named table: "delete" for
// a plain table, "partitioned" for a partitioned one, "" when there is none.
func tableLayout(ctx context.Context, pool *pgxpool.Pool, table string) (string, error) {
	var kind *string
	if err := pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", table).Scan(&kind); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("reading the layout of %s: %w", table, err)
	}
	switch {
	case kind == nil:
		return "", nil
	case *kind == "p":
		return "partitioned", nil
	}
	return "delete", nil
}
