// Package mysql is a store on a MariaDB 10.11 table
// (github.com/go-sql-driver/mysql through database/sql, the driver of
// Watermill's SQL Pub/Sub), shared by every worker that points at it. In
// the one-transaction mode the key is claimed by the first statement of
// the handler's own transaction, and the handler's business writes and the
// record of its success commit together.
//
//	db, _ := sql.Open("mysql", "user:pass@tcp(host:3306)/app") // this package registers the driver
//	st, err := mysql.New(db, mysql.Options{})
//	...
//	err = st.Migrate(ctx) // idempotent, safe from many workers at once
//	defer st.Close()
//	r, err := receiver.NewTransactional(st).Build()
//	// in the handler: tx, _ := mysql.TxFromContext(msg.Context())
//
// # Records
//
// One InnoDB row per (scope, key) in Options.Table of the connection's
// database; migrations/ hold the schema. Scope and key are bytes. Every
// expiry is judged by UTC_TIMESTAMP(6) of the server, never by a worker's
// clock, and times travel as microseconds, whatever the DSN's parseTime
// and loc. The fencing token of a claim is the server clock in
// microseconds, or the key's last token + 1 when that is larger: it rises
// on every execution of a key, across its deletion too as long as the
// server clock does not step back.
//
// # Claims
//
// A claim's first statement inserts the record (INSERT … ON DUPLICATE KEY
// UPDATE that changes nothing): a new key is taken in that one statement.
// A key with a row has it locked by the same statement; the claim reads it
// and decides by the contract (take over an expired lease, carry a
// released key's attempts on, replay, hold, mismatch), and writes it when
// it takes the key, before the lock goes.
//
// The lease mode (store.Store): ClaimLease autocommits a new key, and
// takes a short transaction for a key with a row; Complete, Release and
// Extend are single-row statements conditional on (scope, key, token,
// in progress), else store.ErrLeaseLost.
//
// The one-transaction mode (store.Transactional): ClaimInTx begins the
// handler's transaction (Options.TxOptions) and inserts the record in its
// final, succeeded form; the uncommitted row is the lease. A concurrent
// claim of the key waits on its row lock for TxRequest.Wait, to the
// nearest second (innodb_lock_wait_timeout for that one statement, by SET
// STATEMENT; none below half a second), then replays what the first committed, takes the key when
// it rolled back, or answers Held, contended. Commit commits, preceded by
// an update storing the produced messages when there are some. A
// rolled-back attempt is recorded by RecordRollback in a transaction of
// its own, which never waits for a newer claim (FOR UPDATE NOWAIT).
//
// # Bounds and errors
//
// Every operation is bounded by Options.StatementTimeout: past it, it fails
// with context.DeadlineExceeded and the driver closes its connection.
// database/sql's Tx.Commit and Rollback take no context: the store's own
// short transactions send COMMIT and ROLLBACK as statements under one
// (conn.go); the handler's *sql.Tx ends with Tx.Commit or Rollback, its one
// statement, which the store waits for at most the bound (tx.go finish). A
// lock wait past innodb_lock_wait_timeout (1205) or a deadlock (1213)
// outside a claim is a retryable store failure; a claim reruns after a
// deadlock. Close waits for the operations under way.
//
// # Cleanup
//
// Expired records are invisible at once. A row is removed once it has
// expired and its purge time (set by its claim, from the longest outcome
// TTL) has come, in bounded batches that lock what they pick with FOR
// UPDATE SKIP LOCKED, never waiting for a row a claim holds. The
// background cleaner (Options.CleanupInterval) runs one pass at a time
// across every worker (GET_LOCK on a connection of its own), rests between
// full batches (Options.CleanupDuty), and stops on Close.
//
// # MySQL 8
//
// The statements are MariaDB 10.11's, which this repository tests, and
// Migrate refuses a MySQL server, naming its version. MySQL 8 has no SET
// STATEMENT: it takes the hint /*+ SET_VAR(innodb_lock_wait_timeout=N) */
// instead, and its lowest wait is one second (lockWait in sql.go).
package mysql
