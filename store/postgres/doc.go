// Package postgres is a store on a PostgreSQL table (pgx v5, pgxpool),
// shared by every worker that points at the same table. It is the store for
// payment-grade work: in the one-transaction mode the key is claimed by the
// first statement of the handler's own transaction, and the handler's
// business writes and the record of its success commit together.
//
//	pool, _ := pgxpool.New(ctx, "postgres://...")
//	st, err := postgres.New(pool, postgres.Options{})
//	...
//	err = st.Migrate(ctx) // idempotent, safe from many workers at once
//	defer st.Close()
//	r, err := receiver.NewTransactional(st).Build()
//	// in the handler: tx, _ := postgres.TxFromContext(msg.Context())
//
// # Records
//
// One row per (scope, key) in Options.Schema.Options.Table (default
// public.oncemill_records); migrations/ hold the schema. Every expiry is
// judged by now() of the database, never by a worker's clock. Fencing
// tokens come from a sequence of the table and rise on every execution of
// a key. Every statement names its row by the primary key, or walks the
// purge_at index, so no plan comes to scan the table as it grows.
//
// # The one-transaction mode (store.Transactional)
//
// Claim sends BEGIN and a plain insert of the record, in its final succeeded
// form, in one round trip (pgx.Batch.BeginTx). The uncommitted row is the
// lease: a concurrent claim of the key waits on it, bounded by lock_timeout,
// then replays what the first committed or takes the key when it rolled
// back. The handler writes through TxFromContext; Commit sends COMMIT,
// preceded in the same round trip by an update storing the produced
// messages when there are some. A rolled-back attempt is recorded by
// RecordRollback (a retryable or cached failure that carries the attempt
// count), unless another delivery took the key meanwhile. There is no
// heartbeat.
//
// # The lease mode (store.Store)
//
// ClaimLease is one statement: an INSERT .. ON CONFLICT DO UPDATE that takes the
// key when it is absent, expired, released, or held by an expired lease (the
// fingerprint rule of the contract applies to what it carries on), combined
// with a read of the row it did not take, so the decision (Execute, with or
// without takeover; Replay; Held; Mismatch) comes back in one round
// trip. When a concurrent transaction committed the row after the
// statement's snapshot (READ COMMITTED: neither inserted nor visible), the
// statement runs again. Complete, Release and Extend are single-row UPDATEs
// (or a DELETE) conditional on (scope, key, token, status in progress):
// otherwise store.ErrLeaseLost, and nothing changes. None changes an indexed
// column, so each is a HOT update.
//
// # Bounds
//
// Every operation is bounded by Options.StatementTimeout: past it, it fails
// with context.DeadlineExceeded and pgx closes its connection. Close waits
// for the operations under way, so it returns within the bound too.
//
// # Cleanup
//
// Expired records are invisible at once. A row is removed once it has
// expired and its purge time (set when it was claimed, from the longest
// outcome TTL) has come, in bounded batches that lock what they pick with
// FOR UPDATE SKIP LOCKED, never waiting for a row a claim holds. The
// background cleaner (Options.CleanupInterval) runs one pass at a time across
// every worker (pg_try_advisory_lock on a connection of its own), loops
// batches until nothing is left, and stops on Close. The gauge
// oncemill.store.cleanup.lag reports how far behind it is.
//
// # Layouts
//
// Options.Layout picks the table's layout. LayoutDelete, the default, is
// the one described above: it needs fewer privileges and no upkeep. The
// partitioned layout keeps the records in a table partitioned by claim
// time and drops whole partitions once every row in them is past its purge
// time, instead of deleting rows:
// no unique index can span the partitions, so every claim takes the key's
// advisory lock and then looks the key up in every partition, in a
// statement of its own; a key claimed again after its partition aged moves
// to the current partition. A partition leaves by DETACH PARTITION …
// CONCURRENTLY (PostgreSQL 14 or later) and is then dropped, so no claim
// waits for it; on this layout Complete and Release refuse a lease past
// its purge time and expired. It needs the role to create and drop
// partitions: CREATE on the schema and ownership of the table.
//
// # Limits
//
// Values always travel as parameters; the schema and table names are
// validated as plain identifiers and quoted. Keys longer than
// Options.MaxKeyLen are refused (the idempotency stage hashes them first,
// through store.Limits), results larger than Options.MaxResultBytes are
// refused with store.ErrInvalidRequest, and so are scopes, keys and
// fingerprints that PostgreSQL text cannot hold (a NUL byte, invalid UTF-8).
// A stored error message is cut to 16 KiB at a UTF-8 boundary.
package postgres
