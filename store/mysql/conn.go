package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// The store's own short transactions (a lease claim of a key with a row,
// RecordRollback, a cleanup batch) run on a connection of their own, with
// START TRANSACTION, their statements and COMMIT each sent as a statement
// under the operation's context: the driver closes the connection when the
// context ends first. database/sql's Tx.Commit and Rollback take no
// context, and would wait as long as a stalled server does.

// shortTx begins a transaction on a connection of its own.
func (s *Store) shortTx(ctx context.Context) (*sql.Conn, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION"); err != nil {
		discard(conn)
		return nil, err
	}
	return conn, nil
}

// endShort commits (commit) or rolls back the transaction shortTx began,
// and gives the connection back, or closes it when it cannot tell what the
// connection holds. It returns the COMMIT's error.
func endShort(ctx context.Context, conn *sql.Conn, commit bool) error {
	stmt := "ROLLBACK"
	if commit {
		stmt = "COMMIT"
	}
	if _, err := conn.ExecContext(ctx, stmt); err != nil {
		discard(conn)
		return err
	}
	return conn.Close()
}

// discard closes conn instead of giving it back to the pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
