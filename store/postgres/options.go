package postgres

import (
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store/internal/sqloptions"
)

// Layout is how a Store lays out its records table: Options.Layout.
type Layout int

const (
	// LayoutDelete is one plain table, whose expired rows the background
	// cleaner removes in bounded DELETE batches walking a purge_at index.
	// The default.
	LayoutDelete Layout = iota
	// LayoutPartitioned is a table partitioned by claim time, whose
	// partitions the background cleaner drops whole once every row in them
	// is past its purge time: no DELETE, no purge_at index. Its role
	// creates and drops partitions as it runs. Migrate converts a table of
	// the DELETE layout online, by attaching it as the first partition.
	LayoutPartitioned
)

// setPartitioned is what a store of the DELETE layout says of a table of
// the partitioned layout.
const setPartitioned = "set Options.Layout = postgres.LayoutPartitioned"

// Defaults and bounds of Options.
const (
	defaultSchema          = "public"
	defaultTable           = "oncemill_records"
	defaultCleanupInterval = time.Minute
	defaultRetention       = 24 * time.Hour

	// maxKeyLenLimit bounds Options.MaxKeyLen: scope and key together must
	// fit in one B-tree entry of the primary key (about 2,700 bytes).
	maxKeyLenLimit = 1024
	// maxResultBytesLimit bounds Options.MaxResultBytes. Every replay reads
	// the whole result; larger outputs belong in a table of their own.
	maxResultBytesLimit = 64 << 20
	maxTableLen         = 48 // leaves room for the suffixes of derived names
)

// identRE is what Schema and Table must match: a lower-case SQL identifier
// that needs no quoting. The names are quoted anyway.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Schema holds the table (default "public"). Migrate creates it when
	// missing. Lower-case letters, digits and underscores, not starting
	// with a digit or "pg_".
	Schema string
	// Table is the records table (default "oncemill_records"). The same
	// rules as Schema, at most 48 characters: Migrate derives the names of
	// its sequence, index and version table from it.
	Table string

	// MaxKeyLen is the longest key in bytes that ClaimLease accepts (default
	// 512, at most 1024). Longer keys are refused with
	// store.ErrInvalidRequest; the idempotency stage hashes them first
	// (keygen.StorableKey).
	MaxKeyLen int
	// MaxResultBytes bounds Completion.Result (default 1 MiB, at most 64 MiB).
	// Keep it at least policy.MaxResultBytes, or a success whose produced
	// messages fit the policy is refused here.
	MaxResultBytes int

	// CleanupInterval is how often the background cleaner removes expired
	// records (default 1m; zero means the default; negative turns it off).
	// One cleaner runs at a time across every worker sharing the table.
	CleanupInterval time.Duration
	// CleanupBatch is how many rows one DELETE removes (default 500). A
	// pass loops batches until no expired row is left. Larger batches clean
	// faster and delay the claims that commit beside them more
	// (BenchmarkCleanup1M).
	CleanupBatch int

	// CleanupDuty is the share of a pass's time spent deleting, from above 0
	// to 1 (default 0.5): after each full batch the pass rests so that a
	// large backlog does not take the database away from the handlers.
	// 1 deletes without rest. LayoutPartitioned: the share of the time
	// spent reading a closed partition (for its key filter and its drop),
	// which the pass does 256 kB at a time.
	CleanupDuty float64

	// StatementTimeout bounds every operation of the store (default 5s):
	// acquiring a connection and one statement's round trip, or a
	// one-transaction claim's round trip on top of its wait for the key.
	// Past it the operation fails with context.DeadlineExceeded, and pgx
	// closes the connection it was using, so that a stalled server or
	// network holds no caller longer than this.
	StatementTimeout time.Duration

	// AsyncBegin commits the lease that ClaimLease takes without waiting for the
	// WAL flush (synchronous_commit = off for that statement only). It
	// halves the flushes per message of the lease mode (the
	// one-transaction mode has one flush per message anyway). Without it, a
	// crash of the database server
	// within about 0.6 s of a ClaimLease may forget that lease, and a
	// duplicate delivered after the restart runs again. Off by default.
	AsyncBegin bool

	// TxOptions begin the handler's transaction in the one-transaction
	// mode (default: the server's default isolation, read-write).
	// BeginQuery and CommitQuery are not supported. LayoutPartitioned
	// claims at read committed and accepts no other level: with IsoLevel
	// empty its BEGIN names none while the server's default is read
	// committed (a BEGIN that names one makes the server set, and at the
	// commit reset, a setting in every transaction), and names read
	// committed from the first claim that finds the default is not.
	TxOptions pgx.TxOptions

	// Layout is how the records table is laid out (default LayoutDelete).
	// Every worker sharing a table must use the same layout, the one its
	// table was migrated with.
	Layout Layout
	// Retention is the longest time a record is kept (the longest outcome
	// TTL of the policies on the table). The partitioned layout derives its
	// partition width from it (partitionWidth); the DELETE layout ignores
	// it. Default 24h.
	Retention time.Duration

	// MeterProvider provides the store's metrics (default
	// otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Logger receives errors of the background cleaner (default: discard).
	Logger *slog.Logger

	// width, when set, is the partition width in place of the one
	// Retention gives (partitionWidth, at least a minute): whole seconds,
	// for the benchmarks only (export_test.go, WithPartitionWidth), which
	// must span several retentions in minutes.
	width time.Duration
	// betweenBatches, when set, runs between two batches of a DELETE
	// layout's pass, after the rest: for the benchmarks only
	// (export_test.go, WithBetweenBatches), which hold the pass there for
	// the quiet windows they compare the cleanup's with.
	betweenBatches func()
}

// withDefaults validates o and fills in the defaults. Every error says what
// to change.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, configerr.New("postgres.Options", strings.TrimPrefix(format, "Options."), args...))
	}

	if o.Schema == "" {
		o.Schema = defaultSchema
	}
	if err := checkIdent("Schema", o.Schema, 63); err != nil {
		errs = append(errs, err)
	} else if strings.HasPrefix(o.Schema, "pg_") {
		bad("Options.Schema %q starts with \"pg_\", which PostgreSQL reserves for system schemas; pick another name", o.Schema)
	}
	if o.Table == "" {
		o.Table = defaultTable
	}
	if err := checkIdent("Table", o.Table, maxTableLen); err != nil {
		errs = append(errs, err)
	}

	errs = append(errs, sqloptions.Check("postgres.Options", sqloptions.Shared{
		MaxKeyLen: &o.MaxKeyLen, MaxResultBytes: &o.MaxResultBytes, CleanupBatch: &o.CleanupBatch,
		CleanupDuty: &o.CleanupDuty, StatementTimeout: &o.StatementTimeout,
	}, sqloptions.Limits{MaxKeyLen: maxKeyLenLimit, MaxResultBytes: maxResultBytesLimit})...)
	if o.CleanupInterval == 0 {
		o.CleanupInterval = defaultCleanupInterval
	}
	if o.TxOptions.BeginQuery != "" || o.TxOptions.CommitQuery != "" {
		bad("Options.TxOptions sets BeginQuery or CommitQuery; oncemill writes its own BEGIN and COMMIT: set IsoLevel, AccessMode and DeferrableMode only")
	} else if o.TxOptions.AccessMode == pgx.ReadOnly {
		bad("Options.TxOptions.AccessMode is read only; the handler's transaction writes the record: leave it empty or use pgx.ReadWrite")
	}
	if o.Layout == LayoutPartitioned {
		// The claim's lookup must see what the key's previous holder
		// committed before the claim got the key's lock: a statement's
		// snapshot, not the transaction's (sql_partitioned.go).
		switch o.TxOptions.IsoLevel {
		case "", pgx.ReadCommitted:
		default:
			bad("Options.TxOptions.IsoLevel is %s; the partitioned layout claims a key at read committed (its lookup must see what the previous holder of the key committed): leave it empty or use pgx.ReadCommitted", o.TxOptions.IsoLevel)
		}
	}
	switch {
	case o.Layout != LayoutDelete && o.Layout != LayoutPartitioned:
		bad("Options.Layout is %d; use postgres.LayoutDelete (the default) or postgres.LayoutPartitioned", int(o.Layout))
	}
	switch {
	case o.Retention == 0:
		o.Retention = defaultRetention
	case o.Retention < 0:
		bad("Options.Retention is %v; use a positive duration (the longest outcome TTL of the policies on the table), or 0 for the default %v", o.Retention, defaultRetention)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if len(errs) > 0 {
		return o, errors.Join(errs...)
	}
	return o, nil
}

func checkIdent(field, name string, maxLen int) error {
	if !identRE.MatchString(name) {
		return configerr.New("postgres.Options", "%s %q is not a plain identifier; use lower-case letters, digits and underscores, starting with a letter or underscore (for example %q)", field, name, "oncemill_records")
	}
	if len(name) > maxLen {
		return configerr.New("postgres.Options", "%s %q is %d characters; use at most %d", field, name, len(name), maxLen)
	}
	return nil
}

// Bounds of the partition width (partitionWidth).
const (
	minPartitionWidth = time.Minute
	maxPartitionWidth = 24 * time.Hour
	// partitionsPerRetention is how many partitions one retention spans.
	partitionsPerRetention = 24
)

// partitionWidth is the time range of one partition: a 24th of the
// retention, in whole minutes, from 1 minute to 1 day. A partition is
// dropped once its newest row is past its purge time, so a row outlives its
// purge time by at most about one width (4% of the retention), while a key's
// lookup probes the primary key index of each live partition (about 26):
// 24 keeps both small. The bounds keep the DDL rare (a partition a minute
// at most) and the count of partitions of a long retention near 24 (a
// month is 31 one-day partitions).
func partitionWidth(retention time.Duration) time.Duration {
	w := (retention / partitionsPerRetention).Truncate(time.Minute)
	return min(max(w, minPartitionWidth), maxPartitionWidth)
}
