package worker

// The idempotency store, the ledger that lives beside it, and, for
// PostgreSQL, the one-transaction mode.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/tiered"
)

// Stores is an open store and the ledger beside it.
type Stores struct {
	Store store.Store
	Admin store.Admin // for the readiness probe
	// Tx is the store of the one-transaction mode (postgres, tiered): the
	// handler's ledger write and oncemill's record commit together.
	Tx     store.Transactional
	Ledger Ledger
	// Shared is true when other processes see the same records.
	Shared bool
	Close  func()
}

// connectTimeout bounds connecting to a store at startup.
const connectTimeout = 10 * time.Second

// OpenStore connects to cfg.Store, and to the ledger's PostgreSQL with
// --ledger=postgres. The store clients log through log.
func OpenStore(ctx context.Context, cfg Config, log *slog.Logger) (*Stores, error) {
	ss, err := openStore(ctx, cfg, log)
	if err != nil || cfg.Ledger != "postgres" {
		return ss, err
	}
	led, closeLedger, err := openLedgerPostgres(ctx, cfg, log)
	if err != nil {
		ss.Close()
		return nil, err
	}
	closeStore := ss.Close
	ss.Ledger = led
	ss.Close = func() { closeStore(); closeLedger() }
	return ss, nil
}

func openStore(ctx context.Context, cfg Config, log *slog.Logger) (*Stores, error) {
	switch cfg.Store {
	case "memory":
		st, err := memory.New(memory.Options{})
		if err != nil {
			return nil, fmt.Errorf("memory store: %w", err)
		}
		return &Stores{Store: st, Admin: st, Ledger: NewMemoryLedger(), Close: func() { _ = st.Close() }}, nil
	case "postgres":
		return openPostgres(ctx, cfg)
	case "redis":
		useRedisLogger(log)
		return openRedis(ctx, cfg)
	case "tiered":
		useRedisLogger(log)
		return openTiered(ctx, cfg)
	}
	return nil, fmt.Errorf("--store=%q is not built in", cfg.Store)
}

func openPostgres(ctx context.Context, cfg Config) (*Stores, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	where := redactURL(cfg.PostgresDSN)
	poolCfg, err := pgxpool.ParseConfig(cfg.PostgresDSN)
	if err != nil {
		return nil, fmt.Errorf("postgres (%s): %w", where, err)
	}
	if !strings.Contains(cfg.PostgresDSN, "pool_max_conns") {
		// In the one-transaction mode every handler in flight holds one
		// connection for its transaction and needs no other; a failure
		// takes one more for a moment to record itself, and the cleaner
		// one: size the pool for the worker's concurrency unless the DSN
		// says otherwise.
		poolCfg.MaxConns = int32(concurrency(cfg) + 4)
	}
	if poolCfg.ConnConfig.ConnectTimeout == 0 {
		// A connection to a host that is gone fails, not hangs: with a
		// multi-host string (a failover) the next host is tried after it.
		poolCfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("postgres (%s): %w", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres (%s) does not answer: %w", where, err)
	}
	st, err := postgres.New(pool, postgres.Options{Schema: cfg.PGSchema})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	closeAll := func() { _ = st.Close(); pool.Close() }
	if err := st.Migrate(ctx); err != nil {
		closeAll()
		return nil, fmt.Errorf("postgres store (%s): migrate: %w", where, err)
	}
	led, err := newPostgresLedger(pool, cfg.PGSchema)
	if err == nil {
		err = led.create(ctx)
	}
	if err != nil {
		closeAll()
		return nil, err
	}
	return &Stores{Store: st, Admin: st, Tx: st, Ledger: led, Shared: true, Close: closeAll}, nil
}

// openLedgerPostgres opens the ledger of --ledger=postgres: a table in
// --postgres-schema at --ledger-postgres-dsn, written apart from the
// store's records. The worker starts without it: the ledger's database may
// be down while the records' store is up, and a charge then fails (a
// retryable failure, paced by the attempt schedule) until it is back; the
// table is created by the first statement that reaches it.
func openLedgerPostgres(ctx context.Context, cfg Config, log *slog.Logger) (Ledger, func(), error) {
	dsn := cfg.LedgerPostgresDSN
	if dsn == "" {
		dsn = cfg.PostgresDSN
	}
	where := redactURL(dsn)
	poolCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger postgres (%s): %w", where, err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// One charge at a time per delivery in flight, and the table's creation.
		poolCfg.MaxConns = int32(concurrency(cfg) + 2)
	}
	if poolCfg.ConnConfig.ConnectTimeout == 0 {
		// A charge while the database is unreachable fails, not hangs.
		poolCfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger postgres (%s): %w", where, err)
	}
	led, err := newPostgresLedger(pool, cfg.PGSchema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	led.separate = true
	cctx, cancel := context.WithTimeout(ctx, connectTimeout/2)
	defer cancel()
	if err := led.create(cctx); err != nil {
		log.Warn("The ledger's PostgreSQL does not answer; charges fail until it does", "dsn", where, "error", err.Error())
	}
	return led, pool.Close, nil
}

// newRedisClient connects to --redis-addr, or to the primary that
// --redis-sentinel names. ctxTimeouts lets a context's deadline bound each
// call: the tiered store requires it, to bound a cache tier that stalls.
func newRedisClient(ctx context.Context, cfg Config, ctxTimeouts bool) (*redis.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// Enough connections that no handler's heartbeat queues behind others.
	pool := 2*concurrency(cfg) + 10
	client, where := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, PoolSize: pool, ContextTimeoutEnabled: ctxTimeouts}), cfg.RedisAddr
	if cfg.RedisSentinel != "" {
		// The failover client asks the Sentinels for the primary, and
		// again when it fails over: no restart.
		client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: cfg.RedisMaster, SentinelAddrs: strings.Split(cfg.RedisSentinel, ","), PoolSize: pool, ContextTimeoutEnabled: ctxTimeouts,
		})
		where = cfg.RedisMaster + " at Sentinel " + cfg.RedisSentinel
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis (%s) does not answer: %w", where, err)
	}
	return client, nil
}

func openRedis(ctx context.Context, cfg Config) (*Stores, error) {
	client, err := newRedisClient(ctx, cfg, false)
	if err != nil {
		return nil, err
	}
	st, err := redisstore.New(client, redisstore.Options{Prefix: cfg.RedisPrefix,
		WaitReplicas: cfg.RedisWaitReplicas, WaitTimeout: cfg.RedisWaitTimeout})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis store: %w", err)
	}
	return &Stores{
		Store:  st,
		Admin:  st,
		Ledger: newRedisLedger(client, cfg.RedisPrefix),
		Shared: true,
		Close:  func() { _ = st.Close(); _ = client.Close() },
	}, nil
}

// openTiered is the postgres store, one-transaction mode and ledger
// included, behind the tiered store's local and Redis caches.
func openTiered(ctx context.Context, cfg Config) (*Stores, error) {
	ss, err := openPostgres(ctx, cfg)
	if err != nil {
		return nil, err
	}
	client, err := newRedisClient(ctx, cfg, true)
	if err != nil {
		ss.Close()
		return nil, err
	}
	pg := ss.Store.(*postgres.Store)
	st, err := tiered.New(pg, client, tiered.Options{Prefix: cfg.RedisPrefix})
	if err != nil {
		_ = client.Close()
		ss.Close()
		return nil, fmt.Errorf("tiered store: %w", err)
	}
	closePG := ss.Close
	ss.Store, ss.Admin, ss.Tx = st, st, st
	ss.Close = func() { _ = st.Close(); _ = client.Close(); closePG() }
	return ss, nil
}

// concurrency is how many deliveries the worker handles at once, at most:
// one per partition topic, times the receivers per topic; gochannel hands
// out every published message at once, up to the producer's window.
func concurrency(cfg Config) int {
	switch cfg.Broker {
	case "gochannel":
		return cfg.InFlight
	case "sqs":
		return cfg.Partitions * cfg.SQSWorkers
	case "kafka":
		return cfg.Partitions * cfg.KafkaPartitions
	case "nats":
		return cfg.Partitions * cfg.NATSMaxAckPending
	}
	return cfg.Partitions
}

// storeAnswers is the readiness probe of a store: one read of a key that
// does not exist.
func storeAnswers(ctx context.Context, st store.Admin) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := st.Get(ctx, "oncemill-readyz", "probe")
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}

// redactURL hides the password of a URL-shaped address, for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
