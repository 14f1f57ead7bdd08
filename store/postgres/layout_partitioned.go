package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// What the modes ask of the partitioned layout (layout): its claims, which
// take the key's advisory lock and look the key up in the partitions the
// key filters cannot rule out, and its upkeep, which creates partitions
// ahead of the clock and drops those whose rows may all go.

var _ layout = (*partitionedLayout)(nil)

// newPartitioned is s's layout when Options.Layout says partitioned.
func newPartitioned(s *Store) *partitionedLayout {
	n, async := s.names, s.opts.AsyncBegin
	asyncSQL := ""
	if async {
		asyncSQL = ", set_config('synchronous_commit', 'off', true)"
	}
	l := &partitionedLayout{
		Store: s,
		part: partStatements{
			lockLease:    n.render(strings.ReplaceAll(sqlPartLockLease, "{{ASYNC}}", asyncSQL)),
			lockTx:       n.render(sqlPartLockTx),
			tryLock:      n.render(sqlPartTryLock),
			lockDeferred: n.render(sqlPartLockDeferred),
			everywhere:   renderPartClaims(n, time.Time{}, partition{}),
		},
		width:        cmp.Or(s.opts.width, partitionWidth(s.opts.Retention)),
		partitionKey: lockKey("partitions", n),
		partNext:     map[string]closedNext{},
	}
	// Complete and Release refuse a row past its purge time and expired,
	// which the upkeep may drop with its partition (partLive). In place,
	// they and Extend write only a row claimed within filterDelay; an older
	// one they move (partFresh, partMove).
	aged := strings.NewReplacer("{{AGED}}", fmt.Sprint(micros(l.filterDelay())))
	s.sql.complete = n.render(aged.Replace(sqlComplete + partLive + partFresh))
	s.sql.release = n.render(aged.Replace(sqlRelease + partLive + partFresh))
	s.sql.extend = n.render(aged.Replace(sqlPartExtend))
	s.sql.completeMove = n.render(sqlPartCompleteMove)
	s.sql.releaseMove = n.render(sqlPartReleaseMove)
	s.sql.extendMove = n.render(sqlPartExtendMove)
	return l
}

// claimLease is ClaimLease's statement: BEGIN, the key's advisory lock,
// the claim and COMMIT in one batch (one round trip).
func (s *partitionedLayout) claimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	b := &pgx.Batch{}
	// At read committed whatever the server's default, so that the claim's
	// snapshot is taken after the lock is granted.
	// (A plain query, not Batch.BeginTx: the pool takes the connection back
	// when the batch is closed.)
	b.Queue("begin isolation level read committed")
	h := keyHash(req.Scope, req.Key)
	b.Queue(s.part.lockLease, claimLockKey(h))
	b.Queue(s.keyFilters.Load().claimsFor(h, &s.part.everywhere).lease, req.Scope, req.Key, req.Fingerprint,
		micros(req.LeaseDuration), micros(req.LeaseDuration+req.Retain), req.MessageUUID, micros(s.filterDelay()))
	b.Queue("commit")
	br := s.pool.SendBatch(ctx, b)
	_, err := br.Exec()
	var res store.ClaimResult
	if err == nil {
		res, err = batchClaim(br, req.Scope, req.Key)
	}
	if err == nil {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("the claim's transaction ended with %s, not COMMIT", tag)
		}
	}
	// An error leaves the transaction open: the pool closes such a
	// connection as it takes it back.
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return store.ClaimResult{}, err
	}
	return res, nil
}

// claimTx is deleteLayout.claimTx (layout_delete.go) in this layout. While the key
// filters leave only the keyed partition of now to look a new key up in,
// the first round trip is BEGIN and sqlPartClaimNewCurrent, as the DELETE
// layout's; for a key it does not take, the key's advisory lock (waiting
// up to waitMS) and sqlPartClaim decide in a second. Otherwise it is
// BEGIN, the lock and sqlPartClaimNew, which takes a new key, looked up in
// the partitions the key filters cannot rule out; for a key that has a
// row, sqlPartClaim decides in a second round trip, under the lock.
func (s *partitionedLayout) claimTx(ctx context.Context, conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, waitMS int64, h uint64) (store.ClaimResult, pgx.Tx, error) {
	lock := claimLockKey(h)
	claims := s.keyFilters.Load().claimsFor(h, &s.part.everywhere)
	oneStatement := claims.inOneStatement(time.Now())
	b := &pgx.Batch{}
	b.BeginTx(s.txOptions())
	if oneStatement {
		b.Queue(claims.newCurrent, newKeyArgs(true, &req, purge, lock)...)
	} else {
		b.Queue(s.part.lockTx, waitMS, lock)
		b.Queue(claims.new, newKeyArgs(false, &req, purge, lock)...)
	}
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return store.ClaimResult{}, nil, err
	}
	var err error
	if !oneStatement {
		_, err = br.Exec() // the lock
	}
	res, tx, taken, err := takeNewKey(br, err, req)
	if taken || err != nil {
		return res, tx, err
	}
	args := []any{req.Scope, req.Key, req.Fingerprint, micros(claimTTL(req.SuccessTTL)), micros(purge), req.MessageUUID, micros(s.filterDelay())}
	if !oneStatement {
		res, err = claimStatement(ctx, tx, claims.tx, args...)
		return res, tx, err
	}
	b = &pgx.Batch{}
	b.Queue(s.part.lockTx, waitMS, lock)
	b.Queue(claims.tx, args...)
	br = tx.SendBatch(ctx, b)
	res, err = batchClaim(br, req.Scope, req.Key)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return res, tx, err
}

// deferredClaim is the claim in one statement while the key filters
// leave only the keyed partition of now to look a new key up in. Else the
// lock goes in a statement of its own, so that the insert's snapshot,
// taken after it, holds every row a previous holder committed
// (sql_partitioned.go).
func (s *partitionedLayout) deferredClaim(req *store.TxRequest, purge time.Duration, h uint64) (claimtx.Claim, pgx.TxOptions) {
	lock := claimLockKey(h)
	claims := s.keyFilters.Load().claimsFor(h, &s.part.everywhere)
	c := claimtx.Claim{Scope: req.Scope, Key: req.Key}
	if claims.inOneStatement(time.Now()) {
		c.Insert, c.Args = claims.deferredCurrent, newKeyArgs(true, req, purge, lock)
	} else {
		c.Lock, c.LockKey = s.part.lockDeferred, lock
		c.Insert, c.Args = claims.deferred, newKeyArgs(false, req, purge, lock)
	}
	return c, s.txOptions()
}

// recordRollback takes the key's advisory lock without waiting, then
// writes, in one transaction at read committed whatever the server's
// default, so that the write's lookup sees what the key's last holder
// committed before the lock was granted (sql_partitioned.go). A failure
// is rare, so its BEGIN names the level from the first, where a claim's
// names it only when the default is another (beginReadCommitted).
func (s *partitionedLayout) recordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) (int64, error) {
	h := keyHash(lease.Scope, lease.Key)
	var n int64
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, s.part.tryLock, claimLockKey(h)).Scan(&locked); err != nil || !locked {
			return err
		}
		return tx.QueryRow(ctx, s.keyFilters.Load().claimsFor(h, &s.part.everywhere).rollback, lease.Scope, lease.Key, fingerprint, int16(out.Status), lease.Token, int32(lease.Attempt)-uncounted(out),
			micros(out.TTL), pgerr.StorableText(string(out.ErrorKind), pgerr.MaxErrorKindLen), pgerr.StorableText(out.ErrorMessage, pgerr.MaxErrorMessageLen), micros(out.TTL),
			micros(s.filterDelay()), pgerr.StorableText(lease.MessageUUID, pgerr.MaxMessageUUIDLen), micros(out.RetryAfter)).Scan(&n)
	})
	return n, err
}

// txOptions begin a one-transaction claim's transaction: Options.TxOptions,
// at read committed once a claim found the server's default is not
// (beginReadCommitted).
func (s *partitionedLayout) txOptions() pgx.TxOptions {
	opts := s.opts.TxOptions
	if s.beginReadCommitted.Load() {
		opts.IsoLevel = pgx.ReadCommitted
	}
	return opts
}

// partitionEnsures bounds how many times one claim or RecordRollback creates
// the partitions from now on (ensurePartitions) when PostgreSQL finds no
// partition for its row. Once is what the design needs; a claim in a CI
// run met "no partition" again right after creating them, on a machine
// under heavy load, and a few more tries cost nothing where one is enough.
const partitionEnsures = 3

// mend creates the partitions from now on when err is PostgreSQL's
// refusal of a row that no partition covers, at most partitionEnsures
// times for one operation. In a one-transaction claim it also mends a
// transaction that is not at read committed (every claim's BEGIN names it
// from then on, once) and a partition of now that the claim in one
// statement names and that is gone, dropped by hand (the key filters are
// stale: they are loaded again, once).
func (s *partitionedLayout) mend(ctx context.Context, err error, m *mends) (bool, error) {
	switch {
	case pgerr.IsNoPartition(err) && m.ensured < partitionEnsures:
		m.ensured++
		_, _, err = s.ensurePartitions(ctx)
		return true, err
	case !m.inTx:
		return false, nil
	case pgerr.IsMarker(err, notReadCommittedMarker) && !m.namedReadCommitted:
		s.beginReadCommitted.Store(true)
		m.namedReadCommitted = true
		return true, nil
	case pgerr.IsUndefinedTable(err) && !m.refreshed:
		if err := s.refreshKeyFilters(ctx); err != nil {
			return false, wrap("claim", err)
		}
		m.refreshed = true
		return true, nil
	}
	return false, nil
}

// cleanupLag is read from the catalog alone, with now(), in one round
// trip: how long ago the oldest partition was due to be dropped, or 0. A
// partition is due one retention (Options.Retention) and one width after
// its range ends: by then every row claimed in it is past its purge time,
// unless a lease or an outcome TTL outlived the retention. A steady rise
// means the upkeep is not running, its drops keep timing out, or rows live
// longer than Options.Retention says.
func (s *partitionedLayout) cleanupLag(ctx context.Context) (time.Duration, error) {
	now, parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return 0, wrap("cleanup lag", err)
	}
	parts = inTable(parts)
	if len(parts) == 0 {
		return 0, nil
	}
	return max(now.Sub(parts[0].upper.Add(s.opts.Retention+s.width)), 0), nil
}

// clean is the upkeep (partitionUpkeep) when this worker leads, and the
// loading of the key filters its claims use, which every worker does: the
// leader's upkeep loads them from its own read of the catalog, and the
// others, or a leader whose upkeep failed, read it here.
func (s *partitionedLayout) clean(ctx context.Context, leader *pgxpool.Conn) (removed int, err error) {
	if leader != nil {
		removed, err = s.partitionUpkeep(ctx)
		s.metrics.Removed(ctx, removed)
	}
	if (leader == nil || err != nil) && ctx.Err() == nil {
		if ferr := s.refreshKeyFilters(ctx); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	return removed, err
}

// dropExpired is the upkeep, unless another worker's cleaner is in a pass
// (asLeader), bounded by Options.StatementTimeout plus two waits of the
// upkeep's: one for the transactions older than the pass, one for a
// detach.
func (s *partitionedLayout) dropExpired(ctx context.Context) (int, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "delete expired", 2*s.upkeepWait())
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	dropped, err := s.asLeader(ctx, s.partitionUpkeep)
	s.metrics.Removed(ctx, dropped)
	return dropped, err
}

// migrate creates the partitioned table, or converts a table of the DELETE
// layout (convertToPartitioned), then the key filters' table and the
// partitions from now on.
func (s *partitionedLayout) migrate(ctx context.Context, version int) error {
	kind, err := s.migrateTables(ctx, version, func(tx pgx.Tx, kind string, current int) (int, error) {
		if kind != "" {
			return current, nil
		}
		b, err := migrationFS.ReadFile(partitionedMigration)
		if err != nil {
			return 0, fmt.Errorf("oncemill: postgres: migrate: %w", err)
		}
		if _, err := tx.Exec(ctx, s.names.render(string(b)), pgx.QueryExecModeSimpleProtocol); err != nil {
			return 0, fmt.Errorf("oncemill: postgres: migrate: creating the partitioned table: %w", err)
		}
		if _, err := tx.Exec(ctx, s.names.render(`INSERT INTO {{VERSIONS}} (version, name) VALUES ($1, $2)`), partitionedVersion, "partitioned"); err != nil {
			return 0, fmt.Errorf("oncemill: postgres: migrate: recording version %d: %w", partitionedVersion, err)
		}
		return partitionedVersion, nil
	})
	if err != nil {
		return err
	}
	if kind == "r" && version >= partitionedVersion {
		if err := s.convertToPartitioned(ctx); err != nil {
			return err
		}
	}
	if _, err := s.pool.Exec(ctx, s.names.render(sqlKeyFiltersTable)); err != nil {
		return fmt.Errorf("oncemill: postgres: migrate: creating the key filters table: %w", err)
	}
	_, _, err = s.ensurePartitions(ctx)
	return err
}

// partitionUpkeep is the cleaner leader's pass of the partitioned layout,
// on one read of the catalog: it creates partitions up to partitionsAhead
// once the newest ends within half of that (at least a width and a cleaner
// interval away), finishes the drops an earlier pass left half done, reads
// the closed partitions that are due, after one barrier for them all
// (retireClosed: their key filters, and whether their rows may all go),
// drops those whose rows may, deletes the filters of partitions that are
// gone, loads the key filters its own claims use from what it read and
// did, and returns how many rows went. A pass with nothing to do sends two
// statements (the list, the names of the filters), in one round trip, where
// each step used to read the catalog again: every statement of a pass
// takes CPU from the claims on the same server.
func (s *partitionedLayout) partitionUpkeep(ctx context.Context) (int, error) {
	now, parts, have, err := s.listWithFilters(ctx)
	if err != nil {
		return 0, err
	}
	attached := inTable(parts)
	if n := len(attached); n == 0 || attached[n-1].upper.Before(now.Add(s.partitionsAhead()/2)) {
		// It lists them again under its lock (another worker may have
		// created some meanwhile), and what it lists and creates is what
		// the rest of the pass goes on with.
		if now, parts, err = s.ensurePartitions(ctx); err != nil {
			return 0, err
		}
	}
	removed, gone, err := s.finishDrops(ctx, parts)
	if err != nil {
		return removed, err
	}
	live := without(inTable(parts), gone)
	n, retired, built, err := s.retireClosed(ctx, now, live, have)
	removed += n
	if err != nil {
		return removed, err
	}
	live = without(live, retired)
	if err := s.deleteStaleKeyFilters(ctx, live, have); err != nil {
		return removed, err
	}
	return removed, s.loadKeyFilters(ctx, live, have, built)
}
