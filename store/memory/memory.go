package memory

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

const (
	defaultShards          = 64
	maxShards              = 1 << 16
	defaultCleanupInterval = time.Minute
	defaultMaxKeyLen       = 1024
)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Shards is the number of independently locked shards (a power of two,
	// default 64). More shards mean less lock contention between keys.
	Shards int
	// Now is the store's clock (default time.Now). Every expiry is judged by
	// it. Tests pass storetest.Clock.Now.
	Now func() time.Time
	// CleanupInterval is how often expired records are swept (default 1m; a
	// negative value disables the sweeper; zero means the default). Expired
	// records are invisible either way; sweeping frees their memory.
	CleanupInterval time.Duration
	// MaxKeyLen is the longest key in bytes that ClaimLease accepts (default
	// 1024). Longer keys are refused with store.ErrInvalidRequest: callers
	// hash them with keygen.StorableKey instead of truncating them.
	MaxKeyLen int
}

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Shards == 0:
		o.Shards = defaultShards
	case o.Shards < 0 || o.Shards&(o.Shards-1) != 0:
		return o, configerr.New("memory.Options", "Shards is %d; use a power of two such as %d, or 0 for the default", o.Shards, defaultShards)
	case o.Shards > maxShards:
		return o, configerr.New("memory.Options", "Shards is %d; use at most %d", o.Shards, maxShards)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CleanupInterval == 0 {
		o.CleanupInterval = defaultCleanupInterval
	}
	switch {
	case o.MaxKeyLen == 0:
		o.MaxKeyLen = defaultMaxKeyLen
	case o.MaxKeyLen < 0:
		return o, configerr.New("memory.Options", "MaxKeyLen is %d; use a positive length, or 0 for the default %d", o.MaxKeyLen, defaultMaxKeyLen)
	}
	return o, nil
}

// Store is an in-memory store.Store for one process. It is safe for
// concurrent use. Create it with New and stop it with Close.
type Store struct {
	shards    []shard
	mask      uint64
	hash      func(scope, key string) uint64
	now       func() time.Time
	base      time.Time // the instant record times count from
	maxKeyLen int

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{} // closed by Close; nil without a sweeper
	done      chan struct{} // closed when the sweeper has exited
}

var (
	_ store.Store = (*Store)(nil)
	_ store.Admin = (*Store)(nil)
)

// shard is one lock and the records it guards. A key always hashes to the
// same shard, so the shard's token counter gives every key strictly rising
// fencing tokens, even across Delete and expiry.
//
// Records are found by the same 64-bit hash that picked the shard, so a key's
// strings are hashed once per operation; keys whose hashes collide chain
// through record.next.
type shard struct {
	mu      sync.Mutex
	records map[uint64]*record
	token   int64
	// Keeps the locks of neighbouring shards off one cache line pair.
	_ [128 - 24]byte
}

// record is the stored state of one key. Times are nanoseconds since the
// store's base instant, by its clock: plain integers keep the record free of
// time.Location pointers that the garbage collector would trace in every
// record of a large store. For an in-progress record expires equals
// leaseExpires.
type record struct {
	scope, key   string
	next         *record
	fingerprint  string
	status       store.Status
	token        int64
	attempt      int
	leaseExpires int64
	expires      int64
	// purge is when the sweeper may remove the record once it has also
	// expired: set when it is claimed, from LeaseRequest.Retain, so that an
	// expired lease keeps its attempt count that long.
	purge        int64
	retryAt      int64 // a retryable record's next attempt (Completion.RetryAfter); 0: none
	created      int64
	updated      int64
	result       []byte
	errorKind    store.ErrorKind
	errorMessage string
	messageUUID  string // the last claimer's
}

// New returns a store configured by opts, with its sweeper running unless
// opts.CleanupInterval is negative.
func New(opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{
		shards:    make([]shard, opts.Shards),
		mask:      uint64(opts.Shards - 1),
		hash:      seededHash(maphash.MakeSeed()),
		now:       opts.Now,
		base:      opts.Now(),
		maxKeyLen: opts.MaxKeyLen,
	}
	for i := range s.shards {
		s.shards[i].records = make(map[uint64]*record)
	}
	if opts.CleanupInterval > 0 {
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.sweep(opts.CleanupInterval)
	}
	return s, nil
}

// Limits implements store.Store: keys of at most Options.MaxKeyLen bytes,
// results of any size (they stay in this process).
func (s *Store) Limits() store.Limits { return store.Limits{MaxKeyLen: s.maxKeyLen} }

// Close stops the sweeper and waits for it to exit. Afterwards every
// operation returns store.ErrClosed. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
	return nil
}

func (s *Store) sweep(interval time.Duration) {
	defer close(s.done)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-ticker.C:
			s.deleteExpired(context.Background(), 0)
		}
	}
}

// clock is the store's current time as an offset from its base. Sub uses the
// monotonic reading, so a wall-clock step does not expire or revive records.
func (s *Store) clock() int64 { return int64(s.now().Sub(s.base)) }

// at turns a record time back into a time.Time.
func (s *Store) at(t int64) time.Time { return s.base.Add(time.Duration(t)) }

// locate hashes (scope, key) once: the hash picks the shard and is the key
// within it.
func (s *Store) locate(scope, key string) (*shard, uint64) {
	h := s.hash(scope, key)
	return &s.shards[h&s.mask], h
}

func seededHash(seed maphash.Seed) func(scope, key string) uint64 {
	return func(scope, key string) uint64 { return maphash.Comparable(seed, [2]string{scope, key}) }
}

// find returns the record of (scope, key), or nil. sh.mu is held.
func (sh *shard) find(h uint64, scope, key string) *record {
	for r := sh.records[h]; r != nil; r = r.next {
		if r.key == key && r.scope == scope {
			return r
		}
	}
	return nil
}

// remove unlinks rec from its hash chain. sh.mu is held.
func (sh *shard) remove(h uint64, rec *record) {
	head := sh.records[h]
	if head == rec {
		if rec.next == nil {
			delete(sh.records, h)
		} else {
			sh.records[h] = rec.next
		}
		return
	}
	for r := head; r != nil; r = r.next {
		if r.next == rec {
			r.next = rec.next
			return
		}
	}
}

func (s *Store) checkOpen(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("oncemill: memory: %s: %w", op, store.ErrClosed)
	}
	return nil
}

func checkKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("oncemill: memory: %s: empty key: %w", op, store.ErrInvalidRequest)
	}
	return nil
}

// ClaimLease implements store.Store.
func (s *Store) ClaimLease(_ context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := s.checkBegin(req); err != nil {
		return store.ClaimResult{}, err
	}
	sh, h := s.locate(req.Scope, req.Key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	rec := sh.find(h, req.Scope, req.Key)
	if rec == nil {
		rec = &record{scope: req.Scope, key: req.Key, next: sh.records[h]}
		sh.records[h] = rec
	}
	live := now < rec.expires
	if !live && rec.status != store.StatusInProgress {
		// Absent, or finished or released and expired: the key is free.
		rec.restart(req.Fingerprint, now)
		return s.execute(sh, rec, req, now, 1, false), nil
	}

	// The record is live, or an expired lease whose attempt count the new
	// delivery carries on: either way it must be the same payload.
	if req.Fingerprint != "" && rec.fingerprint != "" && req.Fingerprint != rec.fingerprint {
		return s.found(store.DecisionMismatch, rec), nil
	}
	switch rec.status {
	case store.StatusInProgress:
		if live {
			return s.found(store.DecisionHeld, rec), nil
		}
		return s.execute(sh, rec, req, now, rec.attempt+1, true), nil
	case store.StatusRetryable:
		if now < rec.retryAt {
			res := s.found(store.DecisionHeld, rec)
			res.RetryIn = time.Duration(rec.retryAt - now)
			return res, nil
		}
		return s.execute(sh, rec, req, now, rec.attempt+1, false), nil
	default: // succeeded or failed
		return s.found(store.DecisionReplay, rec), nil
	}
}

// restart makes rec a new record of its key, as if it had never been seen.
// Not inlined: a record literal would take ClaimLease's stack frame, on the
// deepest path of every delivery.
//
//go:noinline
func (rec *record) restart(fingerprint string, now int64) {
	*rec = record{scope: rec.scope, key: rec.key, next: rec.next, fingerprint: fingerprint, created: now}
}

// checkBegin refuses what ClaimLease cannot serve. Kept out of ClaimLease so the hot
// path's stack frame stays small.
func (s *Store) checkBegin(req store.LeaseRequest) error {
	if err := requests.ValidateLease(req); err != nil {
		return fmt.Errorf("oncemill: memory: begin: %w", err)
	}
	if len(req.Key) > s.maxKeyLen {
		return fmt.Errorf("oncemill: memory: begin: key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey: %w",
			len(req.Key), s.maxKeyLen, store.ErrInvalidRequest)
	}
	return s.checkOpen("begin")
}

// found answers ClaimLease with a copy of the existing record. sh.mu is held.
//
//go:noinline
func (s *Store) found(d store.Decision, rec *record) store.ClaimResult {
	r := s.snapshot(rec)
	return store.ClaimResult{Decision: d, Record: &r}
}

// execute hands rec to the caller under a new lease. sh.mu is held.
func (s *Store) execute(sh *shard, rec *record, req store.LeaseRequest, now int64, attempt int, takeover bool) store.ClaimResult {
	sh.token++
	rec.status = store.StatusInProgress
	rec.token = sh.token
	rec.attempt = attempt
	if req.Fingerprint != "" {
		rec.fingerprint = req.Fingerprint
	}
	rec.messageUUID = req.MessageUUID
	rec.leaseExpires = now + int64(req.LeaseDuration)
	rec.expires = rec.leaseExpires
	rec.purge = rec.leaseExpires + int64(req.Retain)
	rec.retryAt = 0
	rec.updated = now
	return store.ClaimResult{
		Decision: store.DecisionExecute,
		Takeover: takeover,
		Claim: store.Claim{
			Scope:       rec.scope,
			Key:         rec.key,
			Token:       rec.token,
			Attempt:     attempt,
			ExpiresAt:   s.at(rec.leaseExpires),
			MessageUUID: rec.messageUUID,
		},
	}
}

// holder returns the in-progress record that lease currently holds, or
// ErrLeaseLost. sh.mu is held.
//
// A lease whose expiry has passed still holds its record until someone takes
// it over (or the record is swept): finishing late is safe, because the
// token proves nobody else ran the key since.
func (sh *shard) holder(op string, h uint64, lease store.Claim) (*record, error) {
	rec := sh.find(h, lease.Scope, lease.Key)
	if rec == nil || rec.status != store.StatusInProgress || rec.token != lease.Token {
		return nil, fmt.Errorf("oncemill: memory: %s %q/%q with token %d: %w", op, lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	return rec, nil
}

// Complete implements store.Store.
func (s *Store) Complete(_ context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateCompletion(out); err != nil {
		return fmt.Errorf("oncemill: memory: complete: %w", err)
	}
	if err := checkKey("complete", lease.Key); err != nil {
		return err
	}
	if err := s.checkOpen("complete"); err != nil {
		return err
	}

	// Copy before taking the lock: the caller may reuse its slice.
	result := bytes.Clone(out.Result)
	sh, h := s.locate(lease.Scope, lease.Key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	rec, err := sh.holder("complete", h, lease)
	if err != nil {
		return err
	}
	rec.status = out.Status
	rec.result = result
	rec.errorKind = out.ErrorKind
	rec.errorMessage = out.ErrorMessage
	rec.leaseExpires = 0
	rec.expires = now + int64(out.TTL)
	rec.updated = now
	return nil
}

// Release implements store.Store.
func (s *Store) Release(_ context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateRetry(out); err != nil {
		return fmt.Errorf("oncemill: memory: release: %w", err)
	}
	if err := checkKey("release", lease.Key); err != nil {
		return err
	}
	if err := s.checkOpen("release"); err != nil {
		return err
	}

	sh, h := s.locate(lease.Scope, lease.Key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	rec, err := sh.holder("release", h, lease)
	if err != nil {
		return err
	}
	if out.TTL <= 0 {
		sh.remove(h, rec)
		return nil
	}
	rec.status = store.StatusRetryable
	if out.Uncounted {
		rec.attempt--
	}
	rec.leaseExpires = 0
	rec.expires = now + int64(out.TTL)
	if out.RetryAfter > 0 {
		rec.retryAt = now + int64(out.RetryAfter)
	}
	rec.updated = now
	return nil
}

// Extend implements store.Store.
func (s *Store) Extend(_ context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if d <= 0 {
		return store.Claim{}, fmt.Errorf("oncemill: memory: extend by %v: duration must be positive: %w", d, store.ErrInvalidRequest)
	}
	if err := checkKey("extend", lease.Key); err != nil {
		return store.Claim{}, err
	}
	if err := s.checkOpen("extend"); err != nil {
		return store.Claim{}, err
	}

	sh, h := s.locate(lease.Scope, lease.Key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	rec, err := sh.holder("extend", h, lease)
	if err != nil {
		return store.Claim{}, err
	}
	// Unlike Complete, Extend refuses an expired lease: the holder has been
	// running unprotected and must not pretend otherwise.
	if now >= rec.leaseExpires {
		return store.Claim{}, fmt.Errorf("oncemill: memory: extend %q/%q with token %d: lease expired: %w", lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	rec.leaseExpires = now + int64(d)
	rec.expires = rec.leaseExpires
	rec.updated = now
	return store.Claim{
		Scope:       rec.scope,
		Key:         rec.key,
		Token:       rec.token,
		Attempt:     rec.attempt,
		ExpiresAt:   s.at(rec.leaseExpires),
		MessageUUID: rec.messageUUID,
	}, nil
}

// Get implements store.Store. An in-progress record whose lease has expired
// is not returned, like any other expired record.
func (s *Store) Get(_ context.Context, scope, key string) (store.Record, error) {
	if err := checkKey("get", key); err != nil {
		return store.Record{}, err
	}
	if err := s.checkOpen("get"); err != nil {
		return store.Record{}, err
	}

	sh, h := s.locate(scope, key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	rec := sh.find(h, scope, key)
	if rec == nil || now >= rec.expires {
		return store.Record{}, fmt.Errorf("oncemill: memory: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	return s.snapshot(rec), nil
}

// Delete implements store.Admin: it removes the record only under token.
func (s *Store) Delete(_ context.Context, scope, key string, token int64) error {
	if err := checkKey("delete", key); err != nil {
		return err
	}
	if err := s.checkOpen("delete"); err != nil {
		return err
	}
	sh, h := s.locate(scope, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.find(h, scope, key)
	switch {
	case rec == nil:
		return fmt.Errorf("oncemill: memory: delete %q/%q: %w", scope, key, store.ErrNotFound)
	case rec.token != token:
		return fmt.Errorf("oncemill: memory: delete %q/%q with token %d: the record's token is %d now: %w", scope, key, token, rec.token, store.ErrLeaseLost)
	}
	sh.remove(h, rec)
	return nil
}

// deleteExpired removes up to limit expired records, or all of them when
// limit is 0: records that have expired and whose LeaseRequest.Retain has
// passed, expired leases included (the next ClaimLease of such a key then
// starts again at attempt 1). It holds one shard's lock at a time. The
// sweeper runs it.
func (s *Store) deleteExpired(ctx context.Context, limit int) (int, error) {
	removed := 0
	full := func() bool { return limit > 0 && removed == limit }
	for i := range s.shards {
		if err := ctx.Err(); err != nil {
			return removed, fmt.Errorf("oncemill: memory: delete expired: %w", err)
		}
		sh := &s.shards[i]
		now := s.clock()
		sh.mu.Lock()
		for h, head := range sh.records {
			for rec := head; rec != nil && !full(); {
				next := rec.next
				if now >= rec.expires && now >= rec.purge {
					sh.remove(h, rec)
					removed++
				}
				rec = next
			}
			if full() {
				break
			}
		}
		sh.mu.Unlock()
		if full() {
			break
		}
	}
	return removed, nil
}

// snapshot returns a copy of rec that the caller may keep and change.
func (s *Store) snapshot(rec *record) store.Record {
	r := store.Record{
		Scope:        rec.scope,
		Key:          rec.key,
		Fingerprint:  rec.fingerprint,
		Status:       rec.status,
		Token:        rec.token,
		Attempt:      rec.attempt,
		Result:       bytes.Clone(rec.result),
		ErrorKind:    rec.errorKind,
		ErrorMessage: rec.errorMessage,
		CreatedAt:    s.at(rec.created),
		UpdatedAt:    s.at(rec.updated),
		ExpiresAt:    s.at(rec.expires),
		MessageUUID:  rec.messageUUID,
	}
	if rec.status == store.StatusInProgress {
		r.LeaseExpiresAt = s.at(rec.leaseExpires)
	}
	if rec.retryAt != 0 {
		r.RetryAt = s.at(rec.retryAt)
	}
	return r
}
