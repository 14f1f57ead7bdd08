package filestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// ErrLocked is returned by New when another process (or another Store in
// this one) holds the file for longer than Options.OpenTimeout. A file
// serves one process at a time.
var ErrLocked = errors.New("file locked by another process")

// Store is a store.Store and store.Admin in one file, for one process. It is
// safe for concurrent use. Create it with New and stop it with Close.
type Store struct {
	db        *bolt.DB
	writes    committer
	now       func() time.Time
	path      string
	maxKeyLen int

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stop      chan struct{} // closed by Close; nil without a sweeper
	done      chan struct{} // closed when the sweeper has exited
}

var (
	_ store.Store = (*Store)(nil)
	_ store.Admin = (*Store)(nil)
)

// New opens the file at opts.Path, creating it if absent, and starts the
// sweeper unless opts.CleanupInterval is negative. It fails with ErrLocked
// when another process has the file open past opts.OpenTimeout, and with
// an error naming the file when it finds the file damaged (truncated,
// or a page overwritten); such a file is left as it is.
func New(opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	err = checkFile(opts.Path, opts.OpenTimeout)
	var db *bolt.DB
	if err == nil {
		db, err = bolt.Open(opts.Path, 0o600, &bolt.Options{Timeout: opts.OpenTimeout})
	}
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("oncemill: filestore: open %s: another process (or another Store of this one) has held it for %v (OpenTimeout): one file serves one process; give each worker its own file, or share store/postgres or store/redisstore: %w",
			opts.Path, opts.OpenTimeout, ErrLocked)
	case err != nil:
		return nil, fmt.Errorf("oncemill: filestore: open %s: %w", opts.Path, err)
	}
	if err := db.Update(initFile); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("oncemill: filestore: open %s: %w", opts.Path, err)
	}
	s := &Store{
		db:        db,
		writes:    committer{db: db},
		now:       opts.Now,
		path:      opts.Path,
		maxKeyLen: opts.MaxKeyLen,
	}
	if opts.CleanupInterval > 0 {
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.sweep(opts.CleanupInterval)
	}
	return s, nil
}

// initFile creates the buckets of a new file, and refuses a file of
// another layout.
func initFile(tx *bolt.Tx) error {
	if _, err := tx.CreateBucketIfNotExists(recordsBucket); err != nil {
		return err
	}
	meta, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return err
	}
	switch v := meta.Get(formatKey); {
	case v == nil:
		return meta.Put(formatKey, binary.BigEndian.AppendUint64(nil, formatVersion))
	case len(v) != 8 || binary.BigEndian.Uint64(v) != formatVersion:
		return fmt.Errorf("the file's layout is version %x, this oncemill reads version %d: open it with the oncemill that wrote it", v, formatVersion)
	}
	return nil
}

// Limits implements store.Store: keys of at most Options.MaxKeyLen bytes,
// results of any size bbolt holds (2 GiB).
func (s *Store) Limits() store.Limits { return store.Limits{MaxKeyLen: s.maxKeyLen} }

// Close stops the sweeper, waits for it to exit and closes the file,
// releasing its lock. Afterwards every operation returns store.ErrClosed.
// Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
		// bbolt waits for the transactions under way.
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("oncemill: filestore: close %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

// clock is the store's time, in UTC: what it stores reads the same after
// a restart in another time zone.
func (s *Store) clock() time.Time { return s.now().UTC() }

func (s *Store) checkOpen(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("oncemill: filestore: %s: %w", op, store.ErrClosed)
	}
	return nil
}

// fail wraps an error of bbolt: store.ErrClosed for a file closed
// meanwhile.
func (s *Store) fail(op string, err error) error {
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) || errors.Is(err, bolterrors.ErrTxClosed) {
		err = store.ErrClosed
	}
	return fmt.Errorf("oncemill: filestore: %s: %w", op, err)
}

func checkKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("oncemill: filestore: %s: empty key: %w", op, store.ErrInvalidRequest)
	}
	return nil
}

// load returns the entry of k in tx, or nil. A value that is not a record
// is an error wrapping errUndecodable.
func load(tx *bolt.Tx, k []byte) (*entry, error) {
	v := tx.Bucket(recordsBucket).Get(k)
	if v == nil {
		return nil, nil
	}
	return decodeEntry(k, v)
}

// loadClaimed is load for ClaimLease: a record that cannot be decoded is
// absent, and the claim writes a new one over it. What it held (a result,
// an attempt count) is lost either way; refusing the claim instead would
// nack the message on every delivery, with no way out but an operator.
func loadClaimed(tx *bolt.Tx, k []byte) (*entry, error) {
	e, err := load(tx, k)
	if errors.Is(err, errUndecodable) {
		return nil, nil
	}
	return e, err
}

func save(tx *bolt.Tx, k []byte, e *entry) error {
	v, err := e.encode()
	if err != nil {
		return err
	}
	return tx.Bucket(recordsBucket).Put(k, v)
}

// nextToken counts the file's fencing tokens: one counter for every key,
// so the tokens of a key rise across Release, takeover, expiry and Delete,
// and across restarts.
func nextToken(tx *bolt.Tx) (int64, error) {
	meta := tx.Bucket(metaBucket)
	var n uint64
	if v := meta.Get(tokenKey); len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	}
	n++
	return int64(n), meta.Put(tokenKey, binary.BigEndian.AppendUint64(nil, n))
}

// ClaimLease implements store.Store. A key that is held, finished or
// mismatched is answered from a read transaction; only a claim that
// executes writes, and waits for its commit to reach the disk.
func (s *Store) ClaimLease(_ context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: filestore: begin: %w", err)
	}
	if len(req.Key) > s.maxKeyLen {
		return store.ClaimResult{}, fmt.Errorf("oncemill: filestore: begin: key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey: %w",
			len(req.Key), s.maxKeyLen, store.ErrInvalidRequest)
	}
	if len(req.Scope) > store.MaxScopeLen {
		return store.ClaimResult{}, fmt.Errorf("oncemill: filestore: begin: scope is %d bytes, longer than store.MaxScopeLen %d: %w",
			len(req.Scope), store.MaxScopeLen, store.ErrInvalidRequest)
	}
	if !utf8.ValidString(req.Fingerprint) {
		// JSON would store it as U+FFFD, and the next claim of the same
		// payload would be a mismatch.
		return store.ClaimResult{}, fmt.Errorf("oncemill: filestore: begin: the fingerprint is not valid UTF-8, which the record's JSON holds; encode it (hex, base64): %w", store.ErrInvalidRequest)
	}
	if err := s.checkOpen("begin"); err != nil {
		return store.ClaimResult{}, err
	}
	k := recordKey(req.Scope, req.Key)

	var res store.ClaimResult
	err := s.view(func(tx *bolt.Tx) error {
		e, err := loadClaimed(tx, k)
		if err != nil {
			return err
		}
		res = decide(e, req, s.clock())
		return nil
	})
	if err != nil {
		return store.ClaimResult{}, s.fail("begin", err)
	}
	if res.Decision != store.DecisionExecute {
		return res, nil
	}

	// The key looked free: decide again where the decision is written.
	err = s.writes.update(func(tx *bolt.Tx) error {
		e, err := loadClaimed(tx, k)
		if err != nil {
			return err
		}
		now := s.clock()
		res = decide(e, req, now)
		if res.Decision != store.DecisionExecute {
			return nil
		}
		if e == nil || res.Claim.Attempt == 1 { // absent, or expired: a new record
			e = &entry{Record: store.Record{Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, CreatedAt: now}}
		}
		token, err := nextToken(tx)
		if err != nil {
			return err
		}
		lease := now.Add(req.LeaseDuration)
		r := &e.Record
		// What the record keeps of the request: a field added to both
		// store.LeaseRequest and store.Record is one more line here (the
		// encoding stores every field of store.Record).
		if req.Fingerprint != "" {
			r.Fingerprint = req.Fingerprint
		}
		r.MessageUUID = req.MessageUUID
		r.Status = store.StatusInProgress
		r.Token = token
		r.Attempt = res.Claim.Attempt
		r.LeaseExpiresAt = lease
		r.ExpiresAt = lease
		r.RetryAt = time.Time{}
		r.UpdatedAt = now
		e.purge = lease.Add(req.Retain)
		res.Claim.Token = token
		res.Claim.ExpiresAt = lease
		res.Claim.MessageUUID = req.MessageUUID
		return save(tx, k, e)
	})
	if err != nil {
		return store.ClaimResult{}, s.fail("begin", err)
	}
	return res, nil
}

// decide is ClaimLease's answer for the entry e (nil: absent) at now. For
// DecisionExecute it fills the claim's scope, key, attempt and takeover;
// the caller writes the lease.
func decide(e *entry, req store.LeaseRequest, now time.Time) store.ClaimResult {
	execute := func(attempt int, takeover bool) store.ClaimResult {
		return store.ClaimResult{Decision: store.DecisionExecute, Takeover: takeover,
			Claim: store.Claim{Scope: req.Scope, Key: req.Key, Attempt: attempt}}
	}
	if e == nil {
		return execute(1, false)
	}
	live := now.Before(e.ExpiresAt)
	if !live && e.Status != store.StatusInProgress {
		// Finished or released and expired: the key is free.
		return execute(1, false)
	}
	// The record is live, or an expired lease whose attempt count the new
	// delivery carries on: either way it must be the same payload.
	found := func(d store.Decision) store.ClaimResult {
		r := e.Record
		return store.ClaimResult{Decision: d, Record: &r}
	}
	if req.Fingerprint != "" && e.Fingerprint != "" && req.Fingerprint != e.Fingerprint {
		return found(store.DecisionMismatch)
	}
	switch e.Status {
	case store.StatusInProgress:
		if live {
			return found(store.DecisionHeld)
		}
		return execute(e.Attempt+1, true)
	case store.StatusRetryable:
		if now.Before(e.RetryAt) {
			// A release's pause holds the next attempt back; not an
			// attempt, and nothing is written.
			res := found(store.DecisionHeld)
			res.RetryIn = e.RetryAt.Sub(now)
			return res
		}
		return execute(e.Attempt+1, false)
	default: // succeeded or failed
		return found(store.DecisionReplay)
	}
}

// finish runs change on the in-progress entry that lease holds, and writes
// it back (or removes it when change returns nil). ErrLeaseLost when lease
// no longer holds it. change may be run more than once (committer.update).
//
// A lease whose expiry has passed still holds its record until someone
// takes it over (or the record is swept): finishing late is safe, because
// the token proves nobody else ran the key since.
func (s *Store) finish(op string, lease store.Claim, change func(e *entry, now time.Time) (*entry, error)) error {
	if err := checkKey(op, lease.Key); err != nil {
		return err
	}
	if err := s.checkOpen(op); err != nil {
		return err
	}
	k := recordKey(lease.Scope, lease.Key)
	var refused error
	err := s.writes.update(func(tx *bolt.Tx) error {
		refused = nil
		e, err := load(tx, k)
		if errors.Is(err, errUndecodable) {
			// Nothing proves the lease any more; the next claim overwrites it.
			refused = fmt.Errorf("oncemill: filestore: %s with token %d: %w: %w", op, lease.Token, err, store.ErrLeaseLost)
			return nil
		}
		if err != nil {
			return err
		}
		if e == nil || e.Status != store.StatusInProgress || e.Token != lease.Token {
			refused = fmt.Errorf("oncemill: filestore: %s %q/%q with token %d: %w", op, lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
			return nil
		}
		if e, refused = change(e, s.clock()); refused != nil {
			return nil
		}
		if e == nil {
			return tx.Bucket(recordsBucket).Delete(k)
		}
		return save(tx, k, e)
	})
	if err != nil {
		return s.fail(op, err)
	}
	return refused
}

// Complete implements store.Store.
func (s *Store) Complete(_ context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateCompletion(out); err != nil {
		return fmt.Errorf("oncemill: filestore: complete: %w", err)
	}
	return s.finish("complete", lease, func(e *entry, now time.Time) (*entry, error) {
		e.Status = out.Status
		e.Result = out.Result
		e.ErrorKind = out.ErrorKind
		e.ErrorMessage = out.ErrorMessage
		e.LeaseExpiresAt = time.Time{}
		e.ExpiresAt = now.Add(out.TTL)
		e.UpdatedAt = now
		return e, nil
	})
}

// Release implements store.Store. With out.TTL <= 0 the record is removed.
// The pause (out.RetryAfter) ends at Record.RetryAt, by the store's clock,
// as every expiry here.
func (s *Store) Release(_ context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateRetry(out); err != nil {
		return fmt.Errorf("oncemill: filestore: release: %w", err)
	}
	return s.finish("release", lease, func(e *entry, now time.Time) (*entry, error) {
		if out.TTL <= 0 {
			return nil, nil
		}
		e.Status = store.StatusRetryable
		if out.Uncounted {
			e.Attempt-- // the lease's attempt given back; 0 is allowed
		}
		e.LeaseExpiresAt = time.Time{}
		e.ExpiresAt = now.Add(out.TTL)
		e.RetryAt = time.Time{}
		if out.RetryAfter > 0 {
			e.RetryAt = now.Add(out.RetryAfter)
		}
		e.UpdatedAt = now
		return e, nil
	})
}

// Extend implements store.Store.
func (s *Store) Extend(_ context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if d <= 0 {
		return store.Claim{}, fmt.Errorf("oncemill: filestore: extend by %v: duration must be positive: %w", d, store.ErrInvalidRequest)
	}
	var out store.Claim
	err := s.finish("extend", lease, func(e *entry, now time.Time) (*entry, error) {
		// Unlike Complete, Extend refuses an expired lease: the holder has
		// been running unprotected and must not pretend otherwise.
		if !now.Before(e.LeaseExpiresAt) {
			return nil, fmt.Errorf("oncemill: filestore: extend %q/%q with token %d: lease expired: %w", lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
		}
		e.LeaseExpiresAt = now.Add(d)
		e.ExpiresAt = e.LeaseExpiresAt
		e.UpdatedAt = now
		out = store.Claim{Scope: e.Scope, Key: e.Key, Token: e.Token, Attempt: e.Attempt, ExpiresAt: e.LeaseExpiresAt}
		return e, nil
	})
	if err != nil {
		return store.Claim{}, err
	}
	return out, nil
}

// Get implements store.Admin. An in-progress record whose lease has expired
// is not returned, like any other expired record.
func (s *Store) Get(_ context.Context, scope, key string) (store.Record, error) {
	if err := checkKey("get", key); err != nil {
		return store.Record{}, err
	}
	if err := s.checkOpen("get"); err != nil {
		return store.Record{}, err
	}
	var e *entry
	err := s.view(func(tx *bolt.Tx) (err error) {
		e, err = load(tx, recordKey(scope, key))
		return err
	})
	if err != nil {
		return store.Record{}, s.fail("get", err)
	}
	if e == nil || !s.clock().Before(e.ExpiresAt) {
		return store.Record{}, fmt.Errorf("oncemill: filestore: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	return e.Record, nil
}

// Delete implements store.Admin: it removes the record only under token,
// or a record that cannot be decoded (which has no token) under any.
func (s *Store) Delete(_ context.Context, scope, key string, token int64) error {
	if err := checkKey("delete", key); err != nil {
		return err
	}
	if err := s.checkOpen("delete"); err != nil {
		return err
	}
	k := recordKey(scope, key)
	var refused error
	err := s.writes.update(func(tx *bolt.Tx) error {
		refused = nil
		e, err := load(tx, k)
		switch {
		case errors.Is(err, errUndecodable):
			// No token to compare: the operator removes it.
		case err != nil:
			return err
		case e == nil:
			refused = fmt.Errorf("oncemill: filestore: delete %q/%q: %w", scope, key, store.ErrNotFound)
			return nil
		case e.Token != token:
			refused = fmt.Errorf("oncemill: filestore: delete %q/%q with token %d: the record's token is %d now: %w", scope, key, token, e.Token, store.ErrLeaseLost)
			return nil
		}
		return tx.Bucket(recordsBucket).Delete(k)
	})
	if err != nil {
		return s.fail("delete", err)
	}
	return refused
}
