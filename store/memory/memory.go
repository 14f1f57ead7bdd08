package memory

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
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
	case o.MaxKeyLen > maxTextLen:
		return o, configerr.New("memory.Options", "MaxKeyLen is %d; use at most %d bytes, or 0 for the default %d", o.MaxKeyLen, maxTextLen, defaultMaxKeyLen)
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
// Nothing a shard holds per record contains a pointer: the records sit in
// one slice (slots), their strings and results in one byte slice (text),
// and the index maps a hash to a slot number. The garbage collector, which
// would otherwise trace every record of a large store on every cycle,
// sees three objects per shard, none of which it has to scan; and a new
// record costs no allocation of its own.
//
// Records are found by the same 64-bit hash that picked the shard, so a key's
// strings are hashed once per operation; keys whose hashes collide chain
// through record.next.
type shard struct {
	mu    sync.Mutex
	index map[uint64]int32 // a hash's first record on its chain, by slot
	slots []record
	free  int32 // the first unused slot, chained through record.next; -1: none
	text  []byte
	waste int // bytes of text no record refers to any more
	token int64
	// Keeps the locks of neighbouring shards off one cache line pair.
	_ [128 - 88]byte
}

// record is the stored state of one key. Times are nanoseconds since the
// store's base instant, by its clock. For an in-progress record expires
// equals leaseExpires. Its strings and result are in the shard's text, from
// off, in the order of the text* field numbers.
type record struct {
	hash         uint64
	next         int32 // the next slot on the hash chain, or of the free list; -1: none
	used         bool
	hasResult    bool // the result is not nil (it may be empty)
	status       store.Status
	token        int64
	attempt      int
	leaseExpires int64
	expires      int64
	// purge is when the sweeper may remove the record once it has also
	// expired: set when it is claimed, from LeaseRequest.Retain, so that an
	// expired lease keeps its attempt count that long.
	purge   int64
	retryAt int64 // a retryable record's next attempt (Completion.RetryAfter); 0: none
	created int64
	updated int64
	off     int
	lens    [textFields]uint32
}

// The fields of a record's text, in order.
const (
	textScope = iota
	textKey
	textFingerprint
	textMessageUUID // the last claimer's
	textErrorKind
	textErrorMessage
	textResult
	textFields
)

// maxTextLen bounds each string and the result a record holds
// (record.lens), and is the store's Limits.MaxResultBytes.
const maxTextLen = int(min(math.MaxUint32, math.MaxInt))

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
		s.shards[i].index = make(map[uint64]int32)
		s.shards[i].free = -1
	}
	if opts.CleanupInterval > 0 {
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.sweep(opts.CleanupInterval)
	}
	return s, nil
}

// Limits implements store.Store: keys of at most Options.MaxKeyLen bytes,
// results of up to 4 GiB (they stay in this process).
func (s *Store) Limits() store.Limits {
	return store.Limits{MaxKeyLen: s.maxKeyLen, MaxResultBytes: maxTextLen}
}

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

// lookup returns the slot of the record of (scope, key), or -1. sh.mu
// is held.
func (sh *shard) lookup(h uint64, scope, key string) int32 {
	i, ok := sh.index[h]
	if !ok {
		return -1
	}
	for ; i >= 0; i = sh.slots[i].next {
		if sh.is(&sh.slots[i], scope, key) {
			return i
		}
	}
	return -1
}

// find returns the record of (scope, key), or nil. sh.mu is held.
func (sh *shard) find(h uint64, scope, key string) *record {
	if i := sh.lookup(h, scope, key); i >= 0 {
		return &sh.slots[i]
	}
	return nil
}

// add makes an empty record of hash h, at the head of its chain. It may
// move the slots: a record pointer taken before it is stale. sh.mu is held.
func (sh *shard) add(h uint64) *record {
	next, ok := sh.index[h]
	if !ok {
		next = -1
	}
	i := sh.free
	if i >= 0 {
		sh.free = sh.slots[i].next
	} else {
		i = int32(len(sh.slots))
		sh.slots = append(sh.slots, record{})
	}
	sh.slots[i] = record{hash: h, next: next, used: true}
	sh.index[h] = i
	return &sh.slots[i]
}

// remove unlinks the record in slot i from its hash chain and frees the
// slot. sh.mu is held.
func (sh *shard) remove(i int32) {
	rec := &sh.slots[i]
	if head := sh.index[rec.hash]; head == i {
		if rec.next < 0 {
			delete(sh.index, rec.hash)
		} else {
			sh.index[rec.hash] = rec.next
		}
	} else {
		for j := head; j >= 0; j = sh.slots[j].next {
			if sh.slots[j].next == i {
				sh.slots[j].next = rec.next
				break
			}
		}
	}
	sh.waste += rec.textLen()
	*rec = record{next: sh.free}
	sh.free = i
	sh.compactIfWasteful()
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
		rec = sh.add(h)
		sh.restart(rec, req, now)
		return s.execute(sh, rec, req, now, 1, false), nil
	}
	live := now < rec.expires
	if !live && rec.status != store.StatusInProgress {
		// Finished or released and expired: the key is free.
		sh.restart(rec, req, now)
		return s.execute(sh, rec, req, now, 1, false), nil
	}

	// The record is live, or an expired lease whose attempt count the new
	// delivery carries on: either way it must be the same payload.
	if req.Fingerprint != "" && rec.lens[textFingerprint] != 0 && string(sh.field(rec, textFingerprint)) != req.Fingerprint {
		return s.found(store.DecisionMismatch, sh, rec, req), nil
	}
	switch rec.status {
	case store.StatusInProgress:
		if live {
			return s.found(store.DecisionHeld, sh, rec, req), nil
		}
		sh.claimText(rec, req.Fingerprint, req.MessageUUID)
		return s.execute(sh, rec, req, now, rec.attempt+1, true), nil
	case store.StatusRetryable:
		if now < rec.retryAt {
			res := s.found(store.DecisionHeld, sh, rec, req)
			res.RetryIn = time.Duration(rec.retryAt - now)
			return res, nil
		}
		sh.claimText(rec, req.Fingerprint, req.MessageUUID)
		return s.execute(sh, rec, req, now, rec.attempt+1, false), nil
	default: // succeeded or failed
		return s.found(store.DecisionReplay, sh, rec, req), nil
	}
}

// restart makes rec a new record of req's key, as if it had never been
// seen. Not inlined: a record literal would take ClaimLease's stack frame,
// on the deepest path of every delivery. sh.mu is held.
//
//go:noinline
func (sh *shard) restart(rec *record, req store.LeaseRequest, now int64) {
	*rec = record{hash: rec.hash, next: rec.next, used: true, off: rec.off, lens: rec.lens, created: now}
	sh.newText(rec, req.Scope, req.Key, req.Fingerprint, req.MessageUUID)
}

// checkBegin refuses what ClaimLease cannot serve. Kept out of ClaimLease so the hot
// path's stack frame stays small.
func (s *Store) checkBegin(req store.LeaseRequest) error {
	if err := requests.ValidateLease(req); err != nil {
		return fmt.Errorf("oncemill: memory: begin: %w", err)
	}
	if len(req.Fingerprint) > maxTextLen || len(req.MessageUUID) > maxTextLen || len(req.Scope) > maxTextLen {
		return fmt.Errorf("oncemill: memory: begin: scope, fingerprint or message UUID longer than %d bytes: %w", maxTextLen, store.ErrInvalidRequest)
	}
	if len(req.Key) > s.maxKeyLen {
		return fmt.Errorf("oncemill: memory: begin: key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey: %w",
			len(req.Key), s.maxKeyLen, store.ErrInvalidRequest)
	}
	return s.checkOpen("begin")
}

// found answers ClaimLease with a copy of the existing record, req's. sh.mu
// is held.
//
//go:noinline
func (s *Store) found(d store.Decision, sh *shard, rec *record, req store.LeaseRequest) store.ClaimResult {
	r := s.snapshotOf(sh, rec, req.Scope, req.Key, req.Fingerprint, req.MessageUUID)
	return store.ClaimResult{Decision: d, Record: &r}
}

// execute hands rec to the caller under a new lease; its text is req's
// already. sh.mu is held.
func (s *Store) execute(sh *shard, rec *record, req store.LeaseRequest, now int64, attempt int, takeover bool) store.ClaimResult {
	sh.token++
	rec.status = store.StatusInProgress
	rec.token = sh.token
	rec.attempt = attempt
	rec.leaseExpires = now + int64(req.LeaseDuration)
	rec.expires = rec.leaseExpires
	rec.purge = rec.leaseExpires + int64(req.Retain)
	rec.retryAt = 0
	rec.updated = now
	return store.ClaimResult{
		Decision: store.DecisionExecute,
		Takeover: takeover,
		Claim: store.Claim{
			Scope:       req.Scope,
			Key:         req.Key,
			Token:       rec.token,
			Attempt:     attempt,
			ExpiresAt:   s.at(rec.leaseExpires),
			MessageUUID: req.MessageUUID,
		},
	}
}

// holder returns the in-progress record that lease currently holds, or
// ErrLeaseLost. sh.mu is held.
//
// A lease whose expiry has passed still holds its record until someone takes
// it over (or the record is swept): finishing late is safe, because the
// token proves nobody else ran the key since.
func (sh *shard) holder(op string, h uint64, lease store.Claim) (int32, error) {
	i := sh.lookup(h, lease.Scope, lease.Key)
	if i < 0 || sh.slots[i].status != store.StatusInProgress || sh.slots[i].token != lease.Token {
		return -1, fmt.Errorf("oncemill: memory: %s %q/%q with token %d: %w", op, lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	return i, nil
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
	if len(out.Result) > maxTextLen || len(out.ErrorMessage) > maxTextLen || len(out.ErrorKind) > maxTextLen {
		return fmt.Errorf("oncemill: memory: complete: result or error longer than %d bytes: %w", maxTextLen, store.ErrInvalidRequest)
	}

	sh, h := s.locate(lease.Scope, lease.Key)
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()

	i, err := sh.holder("complete", h, lease)
	if err != nil {
		return err
	}
	rec := &sh.slots[i]
	// The text keeps a copy: the caller may reuse its slice.
	sh.outcomeText(rec, string(out.ErrorKind), out.ErrorMessage, out.Result)
	rec.status = out.Status
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

	i, err := sh.holder("release", h, lease)
	if err != nil {
		return err
	}
	if out.TTL <= 0 {
		sh.remove(i)
		return nil
	}
	rec := &sh.slots[i]
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

	i, err := sh.holder("extend", h, lease)
	if err != nil {
		return store.Claim{}, err
	}
	rec := &sh.slots[i]
	// Unlike Complete, Extend refuses an expired lease: the holder has been
	// running unprotected and must not pretend otherwise.
	if now >= rec.leaseExpires {
		return store.Claim{}, fmt.Errorf("oncemill: memory: extend %q/%q with token %d: lease expired: %w", lease.Scope, lease.Key, lease.Token, store.ErrLeaseLost)
	}
	rec.leaseExpires = now + int64(d)
	rec.expires = rec.leaseExpires
	rec.updated = now
	return store.Claim{
		Scope:       lease.Scope,
		Key:         lease.Key,
		Token:       rec.token,
		Attempt:     rec.attempt,
		ExpiresAt:   s.at(rec.leaseExpires),
		MessageUUID: string(sh.field(rec, textMessageUUID)),
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
	return s.snapshotOf(sh, rec, scope, key, "", ""), nil
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
	i := sh.lookup(h, scope, key)
	switch {
	case i < 0:
		return fmt.Errorf("oncemill: memory: delete %q/%q: %w", scope, key, store.ErrNotFound)
	case sh.slots[i].token != token:
		return fmt.Errorf("oncemill: memory: delete %q/%q with token %d: the record's token is %d now: %w", scope, key, token, sh.slots[i].token, store.ErrLeaseLost)
	}
	sh.remove(i)
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
		for i := range sh.slots {
			if full() {
				break
			}
			if rec := &sh.slots[i]; rec.used && now >= rec.expires && now >= rec.purge {
				sh.remove(int32(i))
				removed++
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
// sh.mu is held.
func (s *Store) snapshot(sh *shard, rec *record) store.Record {
	return s.snapshotOf(sh, rec, "", "", "", "")
}

// snapshotOf is snapshot, with the caller's strings for the fields they
// equal (scope and key do when non-empty; the fingerprint and the message
// UUID of a redelivery do too): the record's text is copied for the others
// only, in one allocation.
func (s *Store) snapshotOf(sh *shard, rec *record, scope, key, fingerprint, messageUUID string) store.Record {
	var given [textResult]string
	given[textScope], given[textKey] = scope, key
	if string(sh.field(rec, textFingerprint)) == fingerprint {
		given[textFingerprint] = fingerprint
	}
	if string(sh.field(rec, textMessageUUID)) == messageUUID {
		given[textMessageUUID] = messageUUID
	}
	var b strings.Builder
	n := 0
	for f, l := range rec.lens[:textResult] {
		if given[f] == "" {
			n += int(l)
		}
	}
	b.Grow(n)
	for f := range textResult {
		if given[f] == "" {
			b.Write(sh.field(rec, f))
		}
	}
	text := b.String()
	var v [textResult]string
	for f, l := range rec.lens[:textResult] {
		if given[f] != "" || l == 0 {
			v[f] = given[f]
			continue
		}
		v[f], text = text[:l], text[l:]
	}
	r := store.Record{
		Scope:        v[textScope],
		Key:          v[textKey],
		Fingerprint:  v[textFingerprint],
		Status:       rec.status,
		Token:        rec.token,
		Attempt:      rec.attempt,
		MessageUUID:  v[textMessageUUID],
		ErrorKind:    store.ErrorKind(v[textErrorKind]),
		ErrorMessage: v[textErrorMessage],
		CreatedAt:    s.at(rec.created),
		UpdatedAt:    s.at(rec.updated),
		ExpiresAt:    s.at(rec.expires),
	}
	if rec.hasResult {
		r.Result = bytes.Clone(sh.field(rec, textResult))
		if r.Result == nil {
			r.Result = []byte{}
		}
	}
	if rec.status == store.StatusInProgress {
		r.LeaseExpiresAt = s.at(rec.leaseExpires)
	}
	if rec.retryAt != 0 {
		r.RetryAt = s.at(rec.retryAt)
	}
	return r
}
