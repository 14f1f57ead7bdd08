package postgres

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
)

// names are the quoted, schema-qualified names of the store's objects. Every
// one is built from validated identifiers by pgx.Identifier.Sanitize, so no
// caller-supplied text ever reaches SQL unquoted; values always travel as
// parameters.
type names struct {
	schema   string // "schema"
	table    string // "schema"."table"
	seq      string // "schema"."table_token_seq"
	seqLit   string // '"schema"."table_token_seq"', for nextval
	index    string // "table_expires_at_idx" (unqualified: CREATE INDEX names it in the table's schema)
	versions string // "schema"."table_migrations"
}

func newNames(schema, table string) names {
	seq := pgx.Identifier{schema, table + "_token_seq"}.Sanitize()
	return names{
		schema:   pgx.Identifier{schema}.Sanitize(),
		table:    pgx.Identifier{schema, table}.Sanitize(),
		seq:      seq,
		seqLit:   "'" + seq + "'", // identifiers are [a-z0-9_]: no quote to escape
		index:    pgx.Identifier{table + "_expires_at_idx"}.Sanitize(),
		versions: pgx.Identifier{schema, table + "_migrations"}.Sanitize(),
	}
}

// render replaces the placeholders of a statement or migration.
func (n names) render(sql string) string {
	return strings.NewReplacer(
		"{{SCHEMA}}", n.schema,
		"{{TABLE}}", n.table,
		"{{SEQ}}", n.seq,
		"{{SEQ_LITERAL}}", n.seqLit,
		"{{INDEX}}", n.index,
		"{{VERSIONS}}", n.versions,
		// Codes shared with Go, so the SQL cannot drift from them.
		"{{IN_PROGRESS}}", fmt.Sprint(int(store.StatusInProgress)),
		"{{SUCCEEDED}}", fmt.Sprint(int(store.StatusSucceeded)),
		"{{FAILED}}", fmt.Sprint(int(store.StatusFailed)),
		"{{RETRYABLE}}", fmt.Sprint(int(store.StatusRetryable)),
		"{{EXECUTE}}", fmt.Sprint(int(store.Execute)),
		"{{REPLAY}}", fmt.Sprint(int(store.Replay)),
		"{{IN_PROGRESS_DECISION}}", fmt.Sprint(int(store.InProgress)),
		"{{MISMATCH}}", fmt.Sprint(int(store.Mismatch)),
	).Replace(sql)
}

// lockKey is an advisory lock key for one purpose on one table.
func lockKey(purpose string, n names) int64 {
	h := fnv.New64a()
	h.Write([]byte("oncemill:" + purpose + ":" + n.table))
	return int64(h.Sum64())
}

// migrateLockKey serializes every oncemill migration in a database, whatever
// the table: two stores creating one new schema at once must not race.
var migrateLockKey = func() int64 {
	h := fnv.New64a()
	h.Write([]byte("oncemill:migrate"))
	return int64(h.Sum64())
}()

// The record is free when it finished or was released and has expired: the
// next Begin starts again at attempt 1. The predicates below are written
// once and used both where the upsert decides and where the answer is
// explained, so the two cannot disagree.
const (
	// o is the existing row inside ON CONFLICT DO UPDATE.
	freeO = `(o.status <> {{IN_PROGRESS}} AND o.expires_at <= now())`
	// carry: an expired lease (takeover) or a live released record: the new
	// delivery carries the attempt count on, if the payload is the same.
	carryO = `((o.status = {{IN_PROGRESS}} AND o.expires_at <= now()) OR (o.status = {{RETRYABLE}} AND o.expires_at > now()))`
	fpOkO  = `(excluded.fingerprint = '' OR o.fingerprint = '' OR excluded.fingerprint = o.fingerprint)`
)

// sqlBegin decides up to MaxBatch Begins in one statement and one round
// trip. The parameters are parallel arrays: scope, key, fingerprint, lease in
// microseconds. Keys of one call are distinct (the coalescer sees to it: ON
// CONFLICT DO UPDATE cannot touch one row twice in a statement) and sorted,
// so concurrent statements lock rows in the same order.
//
// The upsert takes the key when it is absent, free, or carried on, and
// RETURNs the new lease. For a key it did not take, the second half of the
// UNION returns the row as the statement's snapshot saw it, with the
// decision: Replay, InProgress or Mismatch. Decision 0, or no row at all,
// is the READ COMMITTED corner: another transaction changed or inserted the
// row after this statement's snapshot was taken (the upsert saw the newest
// version, the SELECT an older one, or none). The caller runs the statement
// again for those keys, with a fresh snapshot.
//
// Every expiry is judged by now() of the database.
//
// Tokens: a taken-over or reused row gets nextval() in DO UPDATE, after the
// row is locked, so it exceeds every token the row had. A fresh insert
// evaluates nextval() just before its conflict check; a token can only come
// out lower than an earlier one of the same key if, within that instant, the
// key was executed and then deleted by another session (an operator Delete
// of a live lease racing a Begin).
const sqlBegin = `
WITH {{ASYNC_CTE}}req AS (
	SELECT r.scope, r.key, r.fp, r.lease_us, r.ord
	FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) WITH ORDINALITY AS r(scope, key, fp, lease_us, ord){{ASYNC_FROM}}
), up AS (
	INSERT INTO {{TABLE}} AS o (scope, key, fingerprint, status, token, attempt, taken_over,
		lease_expires_at, expires_at, created_at, updated_at)
	SELECT req.scope, req.key, req.fp, {{IN_PROGRESS}}, nextval({{SEQ_LITERAL}}), 1, false,
		now() + req.lease_us * interval '1 microsecond', now() + req.lease_us * interval '1 microsecond', now(), now()
	FROM req
	ON CONFLICT (scope, key) DO UPDATE SET
		status = {{IN_PROGRESS}},
		token = nextval({{SEQ_LITERAL}}),
		attempt = CASE WHEN ` + freeO + ` THEN 1 ELSE o.attempt + 1 END,
		taken_over = (o.status = {{IN_PROGRESS}}),
		fingerprint = CASE WHEN ` + freeO + ` OR excluded.fingerprint <> '' THEN excluded.fingerprint ELSE o.fingerprint END,
		lease_expires_at = excluded.lease_expires_at,
		expires_at = excluded.expires_at,
		result = NULL,
		error_kind = NULL,
		error_message = NULL,
		created_at = CASE WHEN ` + freeO + ` THEN now() ELSE o.created_at END,
		updated_at = now()
	WHERE ` + freeO + ` OR (` + carryO + ` AND ` + fpOkO + `)
	RETURNING o.scope, o.key, o.fingerprint, o.token, o.attempt, o.taken_over,
		o.lease_expires_at, o.created_at, o.updated_at, o.expires_at
)
SELECT req.ord, {{EXECUTE}}::int2, up.fingerprint, {{IN_PROGRESS}}::int2, up.token, up.attempt, up.taken_over,
	up.lease_expires_at, NULL::bytea, ''::text, ''::text, up.created_at, up.updated_at, up.expires_at
FROM req JOIN up ON up.scope = req.scope AND up.key = req.key
UNION ALL
SELECT req.ord,
	(CASE
		WHEN t.status <> {{IN_PROGRESS}} AND t.expires_at <= now() THEN 0
		WHEN req.fp <> '' AND t.fingerprint <> '' AND req.fp <> t.fingerprint THEN {{MISMATCH}}
		WHEN t.status = {{IN_PROGRESS}} AND t.expires_at > now() THEN {{IN_PROGRESS_DECISION}}
		WHEN t.status IN ({{SUCCEEDED}}, {{FAILED}}) THEN {{REPLAY}}
		ELSE 0
	END)::int2,
	t.fingerprint, t.status, t.token, t.attempt, t.taken_over,
	t.lease_expires_at, t.result, coalesce(t.error_kind, ''), coalesce(t.error_message, ''), t.created_at, t.updated_at, t.expires_at
FROM req JOIN {{TABLE}} t ON t.scope = req.scope AND t.key = req.key
WHERE NOT EXISTS (SELECT 1 FROM up WHERE up.scope = req.scope AND up.key = req.key)`

// asyncBegin turns sqlBegin into a statement that commits without waiting
// for the WAL flush (Options.AsyncBegin): set_config(.., true) lasts until
// the end of the statement's own transaction, whose commit reads it. The
// CTE is joined so that it is evaluated.
var asyncBegin = strings.NewReplacer(
	"{{ASYNC_CTE}}", "async AS (SELECT set_config('synchronous_commit', 'off', true)), ",
	"{{ASYNC_FROM}}", ", async",
)

var syncBegin = strings.NewReplacer("{{ASYNC_CTE}}", "", "{{ASYNC_FROM}}", "")

// sqlComplete writes up to MaxBatch outcomes in one statement, each only if
// the caller's token is current and the record in progress. It returns the
// ordinal of every request it applied; a missing one lost its lease. Keys of
// one call are distinct and sorted (one row cannot be updated twice).
const sqlComplete = `
WITH req AS (
	SELECT r.scope, r.key, r.token, r.status, r.result, r.error_kind, r.error_message, r.ttl_us, r.ord
	FROM unnest($1::text[], $2::text[], $3::int8[], $4::int2[], $5::bytea[], $6::text[], $7::text[], $8::int8[])
		WITH ORDINALITY AS r(scope, key, token, status, result, error_kind, error_message, ttl_us, ord)
)
UPDATE {{TABLE}} AS t SET
	status = req.status,
	result = req.result,
	error_kind = nullif(req.error_kind, ''),
	error_message = nullif(req.error_message, ''),
	lease_expires_at = NULL,
	expires_at = now() + req.ttl_us * interval '1 microsecond',
	updated_at = now()
FROM req
WHERE t.scope = req.scope AND t.key = req.key AND t.token = req.token AND t.status = {{IN_PROGRESS}}
RETURNING req.ord`

// sqlExtend pushes a live lease out. It refuses an expired lease.
const sqlExtend = `
UPDATE {{TABLE}} SET
	lease_expires_at = now() + $4 * interval '1 microsecond',
	expires_at = now() + $4 * interval '1 microsecond',
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}} AND expires_at > now()
RETURNING attempt, lease_expires_at`

// sqlRelease keeps the attempt count for keep.
const sqlRelease = `
UPDATE {{TABLE}} SET
	status = {{RETRYABLE}},
	lease_expires_at = NULL,
	expires_at = now() + $4 * interval '1 microsecond',
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}}`

// sqlReleaseDelete removes the record (Release with keep <= 0).
const sqlReleaseDelete = `
DELETE FROM {{TABLE}}
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}}`

// sqlGet returns the record while it is visible. An in-progress record
// expires with its lease (expires_at = lease_expires_at).
const sqlGet = `
SELECT fingerprint, status, token, attempt, lease_expires_at, result,
	coalesce(error_kind, ''), coalesce(error_message, ''), created_at, updated_at, expires_at
FROM {{TABLE}}
WHERE scope = $1 AND key = $2 AND expires_at > now()`

const sqlDelete = `DELETE FROM {{TABLE}} WHERE scope = $1 AND key = $2`

// sqlDeleteExpired removes up to $1 expired rows. The inner SELECT walks the
// expires_at index from the oldest row and locks what it picks with SKIP
// LOCKED, so it never waits for a Begin that holds a row, and a Begin waits
// at most for one short batch. FOR UPDATE re-checks expires_at on the newest
// version of each row, so a row taken over meanwhile is left alone, and the
// rows stay locked until the DELETE, which finds them by ctid (a TID scan:
// no other condition, or the planner may scan every expired row per batch).
const sqlDeleteExpired = `
DELETE FROM {{TABLE}}
WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {{TABLE}}
	WHERE expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED))`

// sqlCleanupBatch is one batch of a cleanup pass: sqlDeleteExpired that
// starts its index walk at $2, the oldest expiry the previous batch of the
// pass removed, so that a pass does not walk over the index entries of the
// rows it already deleted again and again. It reports how many rows it
// removed and the newest expiry among them. Rows it skips (locked, or
// behind the cursor) are found by the next pass, which starts from the
// beginning.
const sqlCleanupBatch = `
WITH gone AS (
	DELETE FROM {{TABLE}}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{TABLE}}
		WHERE expires_at <= now() AND expires_at >= $2
		ORDER BY expires_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING expires_at
)
SELECT count(*), coalesce(max(expires_at), $2) FROM gone`

// sqlCleanupLag is the age of the oldest expired row, in seconds: how far
// cleanup is behind. 0 when nothing expired is left.
const sqlCleanupLag = `
SELECT coalesce(extract(epoch FROM now() - min(expires_at)), 0)::float8
FROM {{TABLE}} WHERE expires_at <= now()`

// statements are the store's SQL with its names filled in.
type statements struct {
	begin, complete, extend, release, releaseDelete, get, del, deleteExpired, cleanupBatch, cleanupLag string
}

func newStatements(n names, async bool) statements {
	begin := syncBegin.Replace(sqlBegin)
	if async {
		begin = asyncBegin.Replace(sqlBegin)
	}
	return statements{
		begin:         n.render(begin),
		complete:      n.render(sqlComplete),
		extend:        n.render(sqlExtend),
		release:       n.render(sqlRelease),
		releaseDelete: n.render(sqlReleaseDelete),
		get:           n.render(sqlGet),
		del:           n.render(sqlDelete),
		deleteExpired: n.render(sqlDeleteExpired),
		cleanupBatch:  n.render(sqlCleanupBatch),
		cleanupLag:    n.render(sqlCleanupLag),
	}
}
