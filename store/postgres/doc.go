// Package postgres is a store.Store on a PostgreSQL table (pgx v5, pgxpool),
// shared by every worker that points at the same table. It is the store for
// payment-grade work: with the pipeline's transaction stage, the handler's
// business writes and the record of its success commit in one transaction.
//
//	pool, _ := pgxpool.New(ctx, "postgres://...")
//	st, err := postgres.New(pool, postgres.Options{})
//	...
//	err = st.Migrate(ctx) // idempotent, safe from many workers at once
//	defer st.Close()
//
// # Records
//
// One row per (scope, key) in Options.Schema.Options.Table (default
// public.oncemill_records); migrations/0001_records.sql is the schema.
// Every expiry is judged by now() of the database, never by a worker's
// clock. Fencing tokens come from a sequence of the table, so they rise on
// every execution of a key, across takeover, release, delete and expiry.
//
// Begin is one statement: an INSERT .. ON CONFLICT DO UPDATE that takes the
// key when it is absent, expired, released, or held by an expired lease (the
// fingerprint rule of the contract applies to what it carries on), combined
// with a read of the row it did not take, so the decision (Execute, with or
// without takeover; Replay; InProgress; Mismatch) comes back in one round
// trip. When a concurrent transaction committed the row after the
// statement's snapshot (READ COMMITTED: neither inserted nor visible), the
// statement runs again for that key.
//
// Complete, Release and Extend are UPDATEs (or a DELETE) conditional on
// (scope, key, token, status in progress): otherwise store.ErrLeaseLost, and
// nothing changes. Extend also refuses a lease that has already expired.
//
// # Coalescing
//
// Concurrent Begins from many handler goroutines share statements. A caller
// that finds a statement slot free (Options.BatchWorkers, default 1) runs
// its own request at once, in its own goroutine, together with whatever
// other requests are queued, up to Options.MaxBatch, as one multi-row
// statement (parallel arrays through unnest): one round trip and one commit
// for all of them. Callers that find every slot busy queue; when a
// statement ends, the oldest queued caller runs the next one with
// everything queued by then. There is no linger: a lone request goes at
// once, and under load a statement carries what arrived while the previous
// one ran. Completes are coalesced the same way. Each caller gets its own
// answer. Keys are sorted within a statement so that concurrent statements
// lock rows in the same order; a key that appears twice in one batch goes
// into a later statement of the same batch, so the second request sees the
// first one's effect, as if they had arrived one after another.
//
// # Transactional mode
//
// TxManager satisfies pipeline.TxManager: it begins the handler's
// transaction on the pool and puts it in the context, where the handler
// finds it with TxFromContext. Right before the commit, the idempotency
// stage writes the success inside that transaction (CompleteInTx). The
// business writes and the record commit together or not at all; a lease
// taken over meanwhile makes CompleteInTx return store.ErrLeaseLost, and
// everything rolls back. See docs/stores.md for what this does and does not
// guarantee.
//
// # Cleanup
//
// Expired records are invisible at once. DeleteExpired removes them in
// bounded batches (DELETE .. WHERE ctid = ANY(ARRAY(SELECT .. LIMIT n FOR
// UPDATE SKIP LOCKED))), never waiting for a row a Begin holds. The
// background cleaner (Options.CleanupInterval) runs one pass at a time across
// every worker (pg_try_advisory_lock on a connection of its own), loops
// batches until nothing expired is left, and stops on Close. The gauge
// oncemill.store.cleanup.lag reports how far behind it is.
//
// # Limits
//
// Values always travel as parameters; the schema and table names are
// validated as plain identifiers and quoted. Keys longer than
// Options.MaxKeyLen are refused (the idempotency stage hashes them first,
// through store.KeyLimiter), results larger than Options.MaxResultBytes are
// refused with store.ErrInvalidRequest, and so are scopes, keys and
// fingerprints that PostgreSQL text cannot hold (a NUL byte, invalid UTF-8).
package postgres
