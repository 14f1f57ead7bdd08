package mysql

import (
	"database/sql"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store/internal/sqloptions"
)

// Defaults and bounds of Options.
const (
	defaultTable           = "oncemill_records"
	defaultCleanupInterval = time.Minute

	// maxKeyLenLimit is the width of the key column: scope and key
	// together (2,048 bytes) fit InnoDB's 3,072-byte index entry.
	maxKeyLenLimit = 1024
	// maxResultBytesLimit stays under the server's default
	// max_allowed_packet (16 MiB on MariaDB 10.11 and 64 MiB on MySQL 8),
	// which bounds one statement's parameters.
	maxResultBytesLimit = 15 << 20
	maxTableLen         = 48 // leaves room for the suffix of the version table
)

// identRE is what Table must match: a lower-case identifier that needs no
// quoting on any server. The name is quoted anyway.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Table is the records table (default "oncemill_records") in the
	// connection's database. Lower-case letters, digits and underscores,
	// not starting with a digit, at most 48 characters: Migrate derives
	// the name of its version table from it.
	Table string

	// MaxKeyLen is the longest key in bytes that a claim accepts (default
	// 512, at most 1024). Longer keys are refused with
	// store.ErrInvalidRequest; the idempotency stage hashes them first
	// (keygen.StorableKey).
	MaxKeyLen int
	// MaxResultBytes bounds Completion.Result (default 1 MiB, at most
	// 15 MiB, below the server's default max_allowed_packet). Keep it at
	// least policy.MaxResultBytes.
	MaxResultBytes int

	// CleanupInterval is how often the background cleaner removes expired
	// records (default 1m; zero means the default; negative turns it off).
	// One cleaner runs at a time across every worker sharing the table.
	CleanupInterval time.Duration
	// CleanupBatch is how many rows one batch deletes (default 500). A
	// pass loops batches until no expired row is left.
	CleanupBatch int
	// CleanupDuty is the share of a pass's time spent deleting, above 0
	// and at most 1 (default 0.5): after each full batch the pass rests so
	// that a backlog does not take the server away from the handlers.
	CleanupDuty float64

	// StatementTimeout bounds every operation of the store (default 5s):
	// acquiring a connection and its statements' round trips, or a
	// one-transaction claim's round trips on top of its wait for the key.
	// Past it the operation fails with context.DeadlineExceeded and the
	// driver closes the connection it was using; a one-transaction COMMIT
	// or ROLLBACK, which database/sql sends without a context, leaves its
	// connection to come back to the pool when the server answers.
	StatementTimeout time.Duration

	// TxOptions begin the handler's transaction in the one-transaction
	// mode (default: the server's default isolation, read-write).
	TxOptions sql.TxOptions

	// MeterProvider provides the store's metrics, the PostgreSQL store's
	// cleanup lag and deleted records (default otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Logger receives errors of the background cleaner (default: discard).
	Logger *slog.Logger
}

// withDefaults validates o and fills in the defaults. Every error says what
// to change.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, configerr.New("mysql.Options", strings.TrimPrefix(format, "Options."), args...))
	}
	if o.Table == "" {
		o.Table = defaultTable
	}
	switch {
	case !identRE.MatchString(o.Table):
		bad("Options.Table %q is not a plain identifier; use lower-case letters, digits and underscores, starting with a letter or underscore (for example %q)", o.Table, defaultTable)
	case len(o.Table) > maxTableLen:
		bad("Options.Table %q is %d characters; use at most %d", o.Table, len(o.Table), maxTableLen)
	}
	errs = append(errs, sqloptions.Check("mysql.Options", sqloptions.Shared{
		MaxKeyLen: &o.MaxKeyLen, MaxResultBytes: &o.MaxResultBytes, CleanupBatch: &o.CleanupBatch,
		CleanupDuty: &o.CleanupDuty, StatementTimeout: &o.StatementTimeout,
	}, sqloptions.Limits{MaxKeyLen: maxKeyLenLimit, MaxResultBytes: maxResultBytesLimit})...)
	if o.CleanupInterval == 0 {
		o.CleanupInterval = defaultCleanupInterval
	}
	if o.TxOptions.ReadOnly {
		bad("Options.TxOptions.ReadOnly is set; the handler's transaction writes the record: leave it false")
	}
	switch o.TxOptions.Isolation {
	case sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
	default:
		bad("Options.TxOptions.Isolation is %v; use sql.LevelDefault, LevelReadCommitted, LevelRepeatableRead or LevelSerializable", o.TxOptions.Isolation)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, errors.Join(errs...)
}
