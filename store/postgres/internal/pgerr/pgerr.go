// Package pgerr is how the PostgreSQL store words its errors, and what it
// refuses or mends of a text before a text column gets it. Every mode of
// the store shares it.
package pgerr

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store"
)

// Bounds of the texts a record keeps, in bytes. A longer one is cut
// (StorableText), not refused: it decides nothing.
const (
	MaxErrorKindLen    = 256
	MaxErrorMessageLen = 16 << 10
	MaxMessageUUIDLen  = 1024
)

// SQLSTATEs the store tells apart.
const (
	// LockNotAvailable is lock_timeout's: a claim waited its bound for
	// another delivery's transaction.
	LockNotAvailable = "55P03"
	// InvalidTextRepresentation is what a statement raises when it casts
	// its marker to a number, to fail on purpose.
	InvalidTextRepresentation = "22P02"
	undefinedTable            = "42P01"
	undefinedColumn           = "42703"
	checkViolation            = "23514"
	insufficientPrivilege     = "42501"
)

// Code is err's SQLSTATE, or "" when err is not PostgreSQL's.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsMarker reports whether err is a statement's failure on purpose: its
// marker cast to a number.
func IsMarker(err error, marker string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == InvalidTextRepresentation && strings.Contains(pgErr.Message, marker)
}

// IsNoPartition reports whether err is PostgreSQL's refusal of a row whose
// claimed_at no partition covers.
func IsNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == checkViolation && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// IsUndefinedTable reports whether err is PostgreSQL's undefined_table.
func IsUndefinedTable(err error) bool { return Code(err) == undefinedTable }

// IsInsufficientPrivilege reports whether err is PostgreSQL's refusal for
// a privilege the role lacks.
func IsInsufficientPrivilege(err error) bool { return Code(err) == insufficientPrivilege }

// Wrap adds the operation to a database error, and a hint when the table is
// missing or older than this build (a column a later migration adds).
func Wrap(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		return fmt.Errorf("oncemill: postgres: %s: %w (run Store.Migrate first)", op, err)
	}
	if errors.As(err, &pgErr) && pgErr.Code == undefinedColumn {
		return fmt.Errorf("oncemill: postgres: %s: %w (the table is at an older schema version than this build: run Store.Migrate, or \"oncemill migrate\")", op, err)
	}
	if errors.As(err, &pgErr) && IsNoPartition(err) {
		return fmt.Errorf("oncemill: postgres: %s: %w (%s; no partition covers it though the partitions from now on were created: "+
			"the server's clock should lie in one, \"oncemill stats\" lists them)", op, err, pgErr.Detail)
	}
	return fmt.Errorf("oncemill: postgres: %s: %w", op, err)
}

// Invalid is the refusal of a request: store.ErrInvalidRequest.
func Invalid(op, format string, args ...any) error {
	return fmt.Errorf("oncemill: postgres: %s: %s: %w", op, fmt.Sprintf(format, args...), store.ErrInvalidRequest)
}

// CheckText refuses what a PostgreSQL text column cannot hold: a NUL byte,
// or bytes that are not UTF-8. Checked before a request joins a batch, so a
// bad one cannot fail the statement of others.
func CheckText(op, field, v string) error {
	if strings.IndexByte(v, 0) >= 0 {
		return Invalid(op, "%s contains a NUL byte, which PostgreSQL text cannot store (the idempotency stage hashes such keys with keygen.StorableKey before they reach a store)", field)
	}
	if !utf8.ValidString(v) {
		return Invalid(op, "%s is not valid UTF-8, which PostgreSQL text requires (the idempotency stage hashes such keys with keygen.StorableKey before they reach a store)", field)
	}
	return nil
}

// StorableText makes a text that decides nothing (an error text, a message
// UUID) fit a text column: NUL bytes and invalid UTF-8 become U+FFFD, and
// it is cut at a character boundary after max bytes. Refusing an error
// text would leave the failure unrecorded.
func StorableText(v string, max int) string {
	if strings.IndexByte(v, 0) >= 0 {
		v = strings.ReplaceAll(v, "\x00", "\uFFFD")
	}
	if !utf8.ValidString(v) {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	if len(v) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut]
	}
	return v
}
