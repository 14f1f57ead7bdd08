package mysql

import (
	"fmt"
	"strings"

	"github.com/oncemill/oncemill/store"
)

// names are the quoted names of the store's objects, in the connection's
// database. Each is built from a validated identifier and quoted with
// backticks, so no caller-supplied text reaches SQL unquoted; values
// always travel as parameters.
type names struct {
	table        string // `table`
	versions     string // `table_migrations`
	versionsName string // table_migrations, unquoted, for information_schema
	purgeIndex   string // `table_purge_at_idx`
	// cleanupLock is the named lock (GET_LOCK) of the table's cleaner,
	// built by the server from DATABASE() and the table: at most 64
	// characters whatever their length.
	cleanupLock string
}

func newNames(table string) names {
	return names{
		table:        "`" + table + "`",
		versions:     "`" + table + "_migrations`",
		versionsName: table + "_migrations",
		purgeIndex:   "`" + table + "_purge_at_idx`",
		cleanupLock:  "CONCAT('oncemill:cleanup:', LEFT(SHA1(CONCAT(DATABASE(), '.', '" + table + "')), 40))",
	}
}

// render replaces the placeholders of a statement or migration.
func (n names) render(sql string) string {
	return strings.NewReplacer(
		"{{TABLE}}", n.table,
		"{{VERSIONS}}", n.versions,
		"{{PURGE_INDEX}}", n.purgeIndex,
		"{{CLEANUP_LOCK}}", n.cleanupLock,
		"{{NOW}}", "UTC_TIMESTAMP(6)",
		"{{NOW_US}}", micros("UTC_TIMESTAMP(6)"),
		// Codes shared with Go, so the SQL cannot drift from them.
		"{{IN_PROGRESS}}", fmt.Sprint(int(store.StatusInProgress)),
		"{{SUCCEEDED}}", fmt.Sprint(int(store.StatusSucceeded)),
		"{{RETRYABLE}}", fmt.Sprint(int(store.StatusRetryable)),
	).Replace(sql)
}

// Times travel as microseconds since 1970 UTC, so that neither the DSN's
// parseTime and loc nor the session's time_zone changes them. The clock is
// always the server's UTC_TIMESTAMP(6), which holds one value for the whole
// of a statement.

// micros is the SQL of the column or expression col in microseconds.
func micros(col string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
}

// fromMicros is the SQL of a DATETIME(6) from microseconds, the parameter.
const fromMicros = "TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00')"

// A claim's first statement inserts the key's record, or finds the row and
// locks it (ON DUPLICATE KEY UPDATE takes its exclusive lock and changes
// nothing). LAST_INSERT_ID tells the two apart whatever the DSN's
// clientFoundRows: for a new row it is the row's token, the server clock
// in microseconds, from which its times follow (expiry = token + $4); for
// an existing one it is 0. Parameters: scope, key, fingerprint, status of
// the new row, its expiry and purge time in microseconds from now, the
// message UUID. {{WAIT}} bounds the wait for a row another transaction
// holds.
const sqlClaimInsert = `{{WAIT}}INSERT INTO {{TABLE}} (scope, ` + "`key`" + `, fingerprint, status, token, attempt, taken_over,
	created_at, updated_at, expires_at, purge_at, message_uuid)
VALUES (?, ?, ?, ?, LAST_INSERT_ID({{NOW_US}}), 1, FALSE,
	{{NOW}}, {{NOW}}, {{NOW}} + INTERVAL ? MICROSECOND, {{NOW}} + INTERVAL ? MICROSECOND, ?)
ON DUPLICATE KEY UPDATE token = token + LAST_INSERT_ID(0)`

// recordColumns are what scanRecord reads.
var recordColumns = "scope, `key`, fingerprint, status, token, attempt, taken_over, result, error_kind, COALESCE(error_message, ''), message_uuid, " +
	micros("created_at") + ", " + micros("updated_at") + ", " + micros("expires_at") + ", " + micros("retry_at")

// sqlClaimRead reads the row a claim locked, with the server's clock.
var sqlClaimRead = `SELECT ` + recordColumns + `, {{NOW_US}} FROM {{TABLE}} WHERE scope = ? AND ` + "`key`" + ` = ? FOR UPDATE`

// sqlClaimTake writes the claim of a key whose row claimRead locked, with
// the values decide chose from that row and that clock reading.
const sqlClaimTake = `UPDATE {{TABLE}} SET
	status = ?, token = ?, attempt = ?, taken_over = ?, fingerprint = ?,
	result = NULL, error_kind = '', error_message = NULL, retry_at = NULL,
	created_at = ` + fromMicros + `, updated_at = ` + fromMicros + `,
	expires_at = ` + fromMicros + `, purge_at = ` + fromMicros + `, message_uuid = ?
WHERE scope = ? AND ` + "`key`" + ` = ?`

// sqlRecordRead locks the row RecordRollback records over, or fails at
// once (NOWAIT) when another transaction holds it: a newer claim's open
// transaction is never waited for.
var sqlRecordRead = `SELECT ` + recordColumns + `, {{NOW_US}} FROM {{TABLE}} WHERE scope = ? AND ` + "`key`" + ` = ? FOR UPDATE NOWAIT`

// sqlRecordInsert records an outcome for a key that has no row. A row
// inserted meanwhile by another delivery makes it fail (duplicate key, or
// a lock held past {{WAIT}}): that delivery's claim is newer. Parameters:
// scope, key, then those of recordSet.
const sqlRecordInsert = `{{WAIT}}INSERT INTO {{TABLE}} SET scope = ?, ` + "`key`" + ` = ?, ` + recordSet

// sqlRecordUpdate records an outcome over the row sqlRecordRead locked.
// Parameters: those of recordSet, then scope, key.
const sqlRecordUpdate = `UPDATE {{TABLE}} SET ` + recordSet + `, taken_over = FALSE, result = NULL
WHERE scope = ? AND ` + "`key`" + ` = ?`

// recordSet are the columns RecordRollback writes: fingerprint, status,
// token, attempt, error kind and text, message UUID, created_at in
// microseconds (NULL: now), the expiry and purge time in microseconds from now, and,
// when the first of the last two is positive, retry_at the second from now.
const recordSet = `fingerprint = ?, status = ?, token = ?, attempt = ?, error_kind = ?, error_message = ?, message_uuid = ?,
	created_at = COALESCE(` + fromMicros + `, {{NOW}}), updated_at = {{NOW}},
	expires_at = {{NOW}} + INTERVAL ? MICROSECOND, purge_at = {{NOW}} + INTERVAL ? MICROSECOND,
	retry_at = IF(? > 0, {{NOW}} + INTERVAL ? MICROSECOND, NULL)`

// sqlCommitResult stores a one-transaction claim's produced messages and
// moves its expiry to TTL from now, in the handler's transaction.
const sqlCommitResult = `UPDATE {{TABLE}} SET
	result = ?, expires_at = GREATEST(expires_at, {{NOW}} + INTERVAL ? MICROSECOND), updated_at = {{NOW}}
WHERE scope = ? AND ` + "`key`" + ` = ? AND token = ?`

// The lease's statements name the row by (scope, key, token) and an
// in-progress status: any other row is store.ErrLeaseLost.
const leaseRow = "scope = ? AND `key` = ? AND token = ? AND status = {{IN_PROGRESS}}"

const sqlComplete = `{{WAIT}}UPDATE {{TABLE}} SET
	status = ?, result = ?, error_kind = ?, error_message = ?,
	expires_at = {{NOW}} + INTERVAL ? MICROSECOND, updated_at = {{NOW}}
WHERE ` + leaseRow

// sqlExtend returns the new expiry, in microseconds, as LAST_INSERT_ID.
const sqlExtend = `{{WAIT}}UPDATE {{TABLE}} SET
	expires_at = TIMESTAMPADD(MICROSECOND, LAST_INSERT_ID({{NOW_US}} + ?), '1970-01-01 00:00:00'), updated_at = {{NOW}}
WHERE ` + leaseRow + ` AND expires_at > {{NOW}}`

const sqlRelease = `{{WAIT}}UPDATE {{TABLE}} SET
	status = {{RETRYABLE}}, attempt = attempt - ?,
	expires_at = {{NOW}} + INTERVAL ? MICROSECOND,
	retry_at = IF(? > 0, {{NOW}} + INTERVAL ? MICROSECOND, NULL),
	updated_at = {{NOW}}
WHERE ` + leaseRow

const sqlReleaseDelete = `{{WAIT}}DELETE FROM {{TABLE}} WHERE ` + leaseRow

var sqlGet = `SELECT ` + recordColumns + ` FROM {{TABLE}} WHERE scope = ? AND ` + "`key`" + ` = ? AND expires_at > {{NOW}}`

// sqlList pages in primary key order; the filters' parameters come twice
// (the test, then the value).
var sqlList = `SELECT ` + recordColumns + ` FROM {{TABLE}}
WHERE (scope, ` + "`key`" + `) > (?, ?)
	AND (? = '' OR scope = ?)
	AND (? = 0 OR status = ?)
	AND (? < 0 OR updated_at < ` + fromMicros + `)
	AND (? = '' OR message_uuid = ?)
ORDER BY scope, ` + "`key`" + `
LIMIT ?`

const sqlDelete = "DELETE FROM {{TABLE}} WHERE scope = ? AND `key` = ? AND token = ?"

const sqlExists = "SELECT COUNT(*) FROM {{TABLE}} WHERE scope = ? AND `key` = ?"

// purgeable is a row cleanup may remove: expired, and past the purge time
// its claim set (the longest outcome TTL, LeaseRequest.Retain).
const purgeable = `purge_at <= {{NOW}} AND expires_at <= {{NOW}}`

// sqlCleanupPick locks a batch of purgeable rows, oldest first, skipping
// those another transaction holds: a claim's open transaction is never
// waited for, nor made to wait.
const sqlCleanupPick = "SELECT scope, `key` FROM {{TABLE}} WHERE " + purgeable + " ORDER BY purge_at LIMIT ? FOR UPDATE SKIP LOCKED"

// sqlCleanupLag is how long ago, in microseconds, the oldest row cleanup
// may remove was due to go (its purge time, on the purge_at index), or 0.
const sqlCleanupLag = "SELECT COALESCE(TIMESTAMPDIFF(MICROSECOND, (SELECT purge_at FROM {{TABLE}} WHERE " + purgeable + " ORDER BY purge_at LIMIT 1), {{NOW}}), 0)"

// statements are the rendered statements of one table.
type statements struct {
	claimInsert, claimRead, claimTake, recordRead, recordInsert, recordUpdate, commitResult,
	complete, extend, release, releaseDelete, get, list, del, exists, cleanupPick, cleanupLag string
}

// newStatements renders the statements of the table n names; the lease's
// statements wait at most leaseWait seconds for a row lock.
func newStatements(n names, leaseWait int64) statements {
	lease := func(sql string) string { return withWait(n.render(sql), leaseWait) }
	return statements{
		claimInsert:   n.render(sqlClaimInsert),
		claimRead:     n.render(sqlClaimRead),
		claimTake:     n.render(sqlClaimTake),
		recordRead:    n.render(sqlRecordRead),
		recordInsert:  n.render(sqlRecordInsert),
		recordUpdate:  n.render(sqlRecordUpdate),
		commitResult:  n.render(sqlCommitResult),
		complete:      lease(sqlComplete),
		extend:        lease(sqlExtend),
		release:       lease(sqlRelease),
		releaseDelete: lease(sqlReleaseDelete),
		get:           n.render(sqlGet),
		list:          n.render(sqlList),
		del:           n.render(sqlDelete),
		exists:        n.render(sqlExists),
		cleanupPick:   n.render(sqlCleanupPick),
		cleanupLag:    n.render(sqlCleanupLag),
	}
}

// lockWait is the prefix that bounds a statement's wait for a row lock to
// secs seconds (innodb_lock_wait_timeout counts whole seconds; 0, on
// MariaDB, is no wait at all). MariaDB sets it for the one statement (SET
// STATEMENT … FOR); MySQL 8 has no SET STATEMENT and takes the hint
// /*+ SET_VAR(innodb_lock_wait_timeout=N) */ after the statement's verb
// instead, where the lowest value is 1.
func lockWait(secs int64) string {
	return fmt.Sprintf("SET STATEMENT innodb_lock_wait_timeout=%d FOR ", secs)
}

// withWait is sql with {{WAIT}} bounding its lock wait to secs seconds.
func withWait(sql string, secs int64) string {
	return strings.Replace(sql, "{{WAIT}}", lockWait(secs), 1)
}
