package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

const (
	defaultPrefix         = "oncemill"
	maxPrefixLen          = 128
	defaultMaxKeyLen      = 512
	defaultMaxResultBytes = 1 << 20
	// maxResultBytes is Redis's default proto-max-bulk-len: no single
	// argument may be longer.
	maxResultBytes = 512 << 20
	scanCount      = 1000
)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Prefix starts every key the store writes (default "oncemill"). Stores
	// with different prefixes share nothing. It may hold letters, digits
	// and "_-.:/", up to 128 bytes: no spaces, no braces (they would change
	// the Redis Cluster hash tag) and no glob characters (they would change
	// what List scans).
	Prefix string
	// MaxKeyLen is the longest key in bytes that ClaimLease accepts (default 512,
	// see store.Limits). Longer keys are refused with
	// store.ErrInvalidRequest: callers hash them with keygen.StorableKey
	// instead of truncating them.
	MaxKeyLen int
	// MaxResultBytes is the largest Completion.Result that Complete stores
	// (default 1 MiB, at most 512 MiB, Redis's largest argument). Larger
	// results are refused with store.ErrInvalidRequest.
	MaxResultBytes int
	// AutoPipeline lets the calls of many handler goroutines share round
	// trips: while more than 4 calls are under way, their commands go
	// through go-redis's full-duplex AutoPipeliner (experimental in go-redis
	// v9.23) instead of taking a connection each. It raises throughput with
	// many concurrent handlers (16 and more) and changes nothing for a few.
	// Each command or script stays one atomic step with its own reply, so
	// the contract is the same either way. go-redis keeps one AutoPipeliner
	// per client, shared by every store on the client and by the client's
	// own AutoPipeline callers; the first to ask decides its options, and it
	// ends with the client. Not available on a *redis.Ring.
	AutoPipeline bool
	// WaitReplicas, when above 0, makes every write of a claim, Complete,
	// Release and Extend wait for that many replicas to acknowledge it
	// (Redis's WAIT, sent in the same round trip on the same connection),
	// so that a failover to one of them keeps the record. Fewer within
	// WaitTimeout fail the call with an error wrapping ErrNotReplicated,
	// which the lease mode retries like any store failure: never a silent
	// success. A claim that fails so gives its lease back first (a new
	// record is removed, a takeover left expired), so the redelivery of
	// the same message is not held back; if even that cannot be written,
	// the lease runs out by itself. A replay or Get is never failed by it:
	// the WAIT after a duplicate's SET NX, which wrote nothing, is ignored.
	// 0, the default, sends no WAIT. It needs a *redis.Client (also from
	// redis.NewFailoverClient) or *redis.ClusterClient, and cannot be used
	// with AutoPipeline. See docs/redis.md for what WAIT does and does not
	// guarantee.
	WaitReplicas int
	// WaitTimeout bounds each WAIT (default 1s when WaitReplicas is set;
	// it must be below the client's ReadTimeout). WAIT's own 0, "forever",
	// is never sent.
	WaitTimeout time.Duration
}

func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if err := validPrefix(o.Prefix); err != nil {
		return o, err
	}
	switch {
	case o.MaxKeyLen == 0:
		o.MaxKeyLen = defaultMaxKeyLen
	case o.MaxKeyLen < 0:
		return o, configerr.New("redis.Options", "MaxKeyLen is %d; use a positive length, or 0 for the default %d", o.MaxKeyLen, defaultMaxKeyLen)
	}
	switch {
	case o.MaxResultBytes == 0:
		o.MaxResultBytes = defaultMaxResultBytes
	case o.MaxResultBytes < 0:
		return o, configerr.New("redis.Options", "MaxResultBytes is %d; use a positive size, or 0 for the default %d (1 MiB)", o.MaxResultBytes, defaultMaxResultBytes)
	case o.MaxResultBytes > maxResultBytes:
		return o, configerr.New("redis.Options", "MaxResultBytes is %d; Redis takes arguments of at most %d bytes (512 MiB): use that or less", o.MaxResultBytes, maxResultBytes)
	}
	return o, nil
}

func validPrefix(p string) error {
	if len(p) > maxPrefixLen {
		return configerr.New("redis.Options", "Prefix is %d bytes; use at most %d", len(p), maxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_', c == '-', c == '.', c == ':', c == '/':
		default:
			return configerr.New("redis.Options", "Prefix %q has %q at byte %d; use only letters, digits and _-.:/ (no spaces, braces or glob characters), e.g. %q",
				p, c, i, defaultPrefix)
		}
	}
	return nil
}

// Store is a store.Store on Redis, shared by every worker that uses the same
// Redis and Prefix. It is safe for concurrent use. It does not own the
// client: close the client when done.
type Store struct {
	client redis.UniversalClient
	// pipe is the client's AutoPipeliner, nil with Options.AutoPipeline
	// off. The client owns it: go-redis shares it among all its users.
	pipe *redis.AutoPipeliner
	// inflight counts the calls under way (enter, leave); with more than
	// pipeAbove of them, commands go through pipe.
	inflight  atomic.Int32
	pipeAbove int32
	// noSetIfEq is set when the server refused SET ... IFEQ (Redis before
	// 8.4, Valkey before 8.1): setIfEq then runs setIfEqScript instead.
	noSetIfEq      atomic.Bool
	prefix         string
	maxKeyLen      int
	maxResultBytes int
	closed         atomic.Bool
	// waitReplicas and waitTimeout are Options.WaitReplicas and
	// WaitTimeout: with waitReplicas 0 no WAIT is sent.
	waitReplicas int
	waitTimeout  time.Duration
}

var (
	_ store.Store = (*Store)(nil)
	_ store.Admin = (*Store)(nil)
)

// New returns a store over client configured by opts. It does not contact
// Redis; the first operation does.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, configerr.New("redis client", "nil; pass a *redis.Client (redis.NewClient) or *redis.ClusterClient")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts, err = opts.waitDefaults(client); err != nil {
		return nil, err
	}
	var pipe *redis.AutoPipeliner
	if opts.AutoPipeline {
		// Full duplex: one held connection that a writer and a reader
		// stream on, which did more for 16 handlers than go-redis's
		// default half-duplex batches.
		pipe, err = client.AutoPipelineWithOptions(&redis.AutoPipelineOptions{FullDuplex: true})
		if err != nil {
			return nil, configerr.New("redis.Options.AutoPipeline", "%w; use a *redis.Client or *redis.ClusterClient, or turn AutoPipeline off", err)
		}
	}
	slotTags() // build the tag table now rather than in the first ClaimLease
	return &Store{
		client:         client,
		pipe:           pipe,
		pipeAbove:      defaultPipeAbove,
		prefix:         opts.Prefix,
		maxKeyLen:      opts.MaxKeyLen,
		maxResultBytes: opts.MaxResultBytes,
		waitReplicas:   opts.WaitReplicas,
		waitTimeout:    opts.WaitTimeout,
	}, nil
}

// Limits implements store.Store: Options.MaxKeyLen and
// Options.MaxResultBytes.
func (s *Store) Limits() store.Limits {
	return store.Limits{MaxKeyLen: s.maxKeyLen, MaxResultBytes: s.maxResultBytes}
}

// Close makes every later operation return store.ErrClosed. It leaves the
// client and its AutoPipeliner running: other stores and callers may share
// them, and they end when the caller closes the client. Close is idempotent.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// defaultPipeAbove is how many calls must be under way before commands share
// round trips. With few calls a command's own round trip is quicker: with 4
// handlers a pipeliner cost throughput, with 16 it added 30-50%
// (BenchmarkVersusSetNX).
const defaultPipeAbove = 4

// commander sends commands: the client, or the AutoPipeliner.
type commander interface {
	redis.Cmdable
	Process(ctx context.Context, cmd redis.Cmder) error
}

// enter starts a call and returns what sends its commands; leave ends it.
func (s *Store) enter() commander {
	if s.pipe == nil {
		return s.client
	}
	if s.inflight.Add(1) > s.pipeAbove {
		return s.pipe
	}
	return s.client
}

func (s *Store) leave() {
	if s.pipe != nil {
		s.inflight.Add(-1)
	}
}

func (s *Store) checkOpen(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("oncemill: redis: %s: %w", op, store.ErrClosed)
	}
	return nil
}

func (s *Store) checkKey(op, key string) error {
	if err := s.checkOpen(op); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("oncemill: redis: %s: empty key: %w", op, store.ErrInvalidRequest)
	}
	return nil
}

// maxDuration bounds every lease, TTL and keep: "forever" (math.MaxInt64 is
// 292 years) counts as 100 years.
const maxDuration = 100 * 365 * 24 * time.Hour

// millis is d in whole milliseconds for PX, at least 1: Redis refuses 0.
func millis(d time.Duration) int64 {
	return max(min(d, maxDuration).Milliseconds(), 1)
}

// maxFingerprintLen keeps a record's stable part (record.go) within its
// 4 hex digits of length, with room for the creation time and the message
// UUID's own length and mark: the fingerprint and the UUID together may
// take this many bytes.
const maxFingerprintLen = maxStableLen - 32

// maxBeginRounds bounds how often one ClaimLease finds the key changed under it
// (taken, finished or removed by other deliveries) before it gives up with
// an error: each round is one that another delivery won.
const maxBeginRounds = 8

// ClaimLease implements store.Store. A new key costs one SET NX; a key that
// exists is read with a GET, which answers a replay; a key held by an
// in-progress or released record goes to claimScript, which takes it if
// the lease has run out.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if err := s.checkOpen("begin"); err != nil {
		return store.ClaimResult{}, err
	}
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: redis: begin: %w", err)
	}
	if len(req.Key) > s.maxKeyLen {
		return store.ClaimResult{}, fmt.Errorf("oncemill: redis: begin: key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey: %w",
			len(req.Key), s.maxKeyLen, store.ErrInvalidRequest)
	}
	if len(req.Fingerprint)+len(req.MessageUUID) > maxFingerprintLen {
		return store.ClaimResult{}, fmt.Errorf("oncemill: redis: begin: fingerprint and message UUID are %d bytes together, longer than %d; use a hash of the payload: %w",
			len(req.Fingerprint)+len(req.MessageUUID), maxFingerprintLen, store.ErrInvalidRequest)
	}
	key := keysFor(s.prefix, req.Scope, req.Key)
	now := time.Now()
	lease := min(req.LeaseDuration, maxDuration)
	tail := min(req.Retain, maxDuration)
	if tail <= 0 {
		tail = lease // LeaseRequest: zero Retain means Lease
	}
	fresh := record{Record: store.Record{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint, Status: store.StatusInProgress,
		Token: now.UnixMicro(), Attempt: 1, ExpiresAt: now.Add(lease), CreatedAt: now, UpdatedAt: now,
		MessageUUID: req.MessageUUID,
	}, tail: tail}
	px := millis(lease + tail)

	value := encode(&fresh)
	var (
		cur  string // the value ClaimLease found, when it has one to decide on
		have bool
	)
	c := s.enter()
	defer s.leave()
	for range maxBeginRounds {
		if !have {
			// SET NX answers OK for a new key. Its GET option would save
			// the round trip of a duplicate, but go-redis takes the nil
			// reply it gives every new key down its error path, 23
			// allocations more (BenchmarkNewKeyReply): new keys come first.
			setNX := redis.NewBoolCmd(ctx, "set", key, value, "px", px, "nx")
			acked := s.process(ctx, c, key, setNX)
			set, err := setNX.Result()
			switch {
			case err != nil:
				return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
			case set && acked != nil:
				return store.ClaimResult{}, fail("begin", req.Scope, req.Key, s.claimFailed(ctx, key, value, true, tail, acked))
			case set:
				return s.execute(&fresh, value, false), nil
			}
			v, err := c.Get(ctx, key).Result()
			switch {
			case errors.Is(err, redis.Nil):
				continue // gone since: SET NX again
			case isWrongType(err):
				if err := migrate(ctx, c, key); err != nil {
					return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
				}
				continue
			case err != nil:
				return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
			}
			cur = v
		}
		have = false
		old, err := decode(req.Scope, req.Key, cur)
		if err != nil {
			return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
		}
		if req.Fingerprint != "" && old.Fingerprint != "" && old.Fingerprint != req.Fingerprint {
			return store.ClaimResult{Decision: store.DecisionMismatch, Record: &old.Record}, nil
		}
		if old.Status == store.StatusSucceeded || old.Status == store.StatusCachedFailure {
			return store.ClaimResult{Decision: store.DecisionReplay, Record: &old.Record}, nil
		}
		// In progress or released: the next attempt, if the lease is gone
		// and no pause holds the key back.
		next := fresh
		next.Token = max(fresh.Token, old.Token+1)
		next.Attempt = old.Attempt + 1
		next.CreatedAt = old.CreatedAt
		if next.Fingerprint == "" {
			next.Fingerprint = old.Fingerprint
		}
		nextValue := encode(&next)
		var (
			reply any
			acked error
		)
		if s.waitReplicas == 0 {
			reply, err = claimScript.Run(ctx, c, []string{key},
				old.Token, string(statusLetter(old.Status)), old.tail.Milliseconds(), nextValue, px).Result()
		} else {
			var cmd *redis.Cmd
			cmd, acked = s.eval(ctx, c, claimScript, key,
				old.Token, string(statusLetter(old.Status)), old.tail.Milliseconds(), nextValue, px)
			reply, err = cmd.Result()
		}
		if err != nil {
			return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
		}
		switch reply := reply.(type) {
		case int64:
			if reply == 1 && acked != nil {
				return store.ClaimResult{}, fail("begin", req.Scope, req.Key, s.claimFailed(ctx, key, nextValue, false, tail, acked))
			}
			if reply == 1 {
				return s.execute(&next, nextValue, old.Status == store.StatusInProgress), nil
			}
			// 0: the key is gone; SET NX again.
		case string:
			cur, have = reply, true
		case []any:
			// {value}: a live lease; {value, ms}: a pause holds the
			// retryable record's next attempt back that long.
			v, _ := reply[0].(string)
			rec, err := decode(req.Scope, req.Key, v)
			if err != nil {
				return store.ClaimResult{}, fail("begin", req.Scope, req.Key, err)
			}
			res := store.ClaimResult{Decision: store.DecisionHeld, Record: &rec.Record}
			if len(reply) == 2 {
				ms, _ := reply[1].(int64)
				res.RetryIn = time.Duration(ms) * time.Millisecond
			}
			return res, nil
		}
	}
	return store.ClaimResult{}, fail("begin", req.Scope, req.Key,
		fmt.Errorf("the key changed under %d rounds of ClaimLease; other deliveries keep taking it", maxBeginRounds))
}

// execute is the answer of a ClaimLease that wrote value, r's record. The lease
// keeps value for finish.
func (s *Store) execute(r *record, value []byte, takeover bool) store.ClaimResult {
	return store.ClaimResult{
		Decision: store.DecisionExecute,
		Claim: store.Claim{Scope: r.Scope, Key: r.Key, Token: r.Token, Attempt: r.Attempt, ExpiresAt: r.ExpiresAt,
			Version: string(value), MessageUUID: r.MessageUUID},
		Takeover: takeover,
	}
}

// fail wraps a Redis error with the operation. A closed client reads as
// store.ErrClosed.
func fail(op, scope, key string, err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("oncemill: redis: %s %q/%q: %w: %w", op, scope, key, store.ErrClosed, err)
	}
	return fmt.Errorf("oncemill: redis: %s %q/%q: %w", op, scope, key, err)
}

// leaseLost is the error of a lease that is not current.
func leaseLost(op string, l store.Claim, why string) error {
	return fmt.Errorf("oncemill: redis: %s %q/%q with token %d: %s: %w", op, l.Scope, l.Key, l.Token, why, store.ErrLeaseLost)
}

// isSyntaxError reports a server that does not know an option: SET IFEQ on
// Redis before 8.4 or Valkey before 8.1.
func isSyntaxError(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "ERR syntax error")
}

// isWrongType reports a command that met a key of layout 0 (a hash).
func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// migrate rewrites a layout-0 record at key in layout 1 (migrateScript).
func migrate(ctx context.Context, c redis.Cmdable, key string) error {
	return migrateScript.Run(ctx, c, []string{key}).Err()
}

// run runs a script on one record, migrating a layout-0 record first if the
// script meets one.
func (s *Store) run(ctx context.Context, script *redis.Script, key string, args ...any) *redis.Cmd {
	c := s.enter()
	defer s.leave()
	cmd := script.Run(ctx, c, []string{key}, args...)
	if isWrongType(cmd.Err()) && migrate(ctx, c, key) == nil {
		cmd = script.Run(ctx, c, []string{key}, args...)
	}
	return cmd
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateCompletion(out); err != nil {
		return fmt.Errorf("oncemill: redis: complete: %w", err)
	}
	if err := s.checkKey("complete", lease.Key); err != nil {
		return err
	}
	if len(out.Result) > s.maxResultBytes {
		return fmt.Errorf("oncemill: redis: complete %q/%q: result is %d bytes, larger than MaxResultBytes %d; store less, or raise Options.MaxResultBytes: %w",
			lease.Scope, lease.Key, len(out.Result), s.maxResultBytes, store.ErrInvalidRequest)
	}
	now := time.Now()
	ttl := min(out.TTL, maxDuration)
	next := record{Record: store.Record{
		Status: out.Status, Token: lease.Token, Attempt: lease.Attempt, ExpiresAt: now.Add(ttl), UpdatedAt: now,
		ErrorKind: out.ErrorKind, ErrorMessage: out.ErrorMessage, Result: out.Result,
	}}
	return s.finish(ctx, "complete", lease, &next, millis(ttl))
}

// finish ends lease with next, to live px ms, or removes the record with
// px 0 (Complete, Release). With the value the lease wrote (Lease.Version),
// that is one compare-and-set of the whole value (setIfEq). When it misses
// (an Extend rewrote the value, or the lease is lost), or there is no
// Version, the finish script compares the lease's head instead and decides.
func (s *Store) finish(ctx context.Context, op string, lease store.Claim, next *record, px int64) error {
	key := keysFor(s.prefix, lease.Scope, lease.Key)
	keep, ok := leaseStable(lease)
	value := unstable(next, len(keep)) // room for keep: the script takes value alone
	if ok && px > 0 {
		done, acked, err := s.setIfEq(ctx, key, append(value, keep...), lease.Version, px)
		switch {
		case done && acked != nil:
			return fail(op, lease.Scope, lease.Key, acked)
		case done:
			return nil
		case err != nil && !isWrongType(err):
			return fail(op, lease.Scope, lease.Key, err)
		}
	}
	// With WAIT, a lease this lease already finished (an earlier try
	// whose WAIT failed) is touched, so that WAIT covers it again.
	finished := ""
	if s.waitReplicas > 0 {
		finished = string(statusLetter(next.Status))
	}
	cmd, acked := s.runWritten(ctx, finishScript, key, leaseHead(lease.Token), value, px, finished)
	code, err := cmd.Int64()
	switch {
	case err != nil:
		return fail(op, lease.Scope, lease.Key, err)
	case (code == codeOK || code == codeFinished) && acked != nil:
		return fail(op, lease.Scope, lease.Key, acked)
	case code == codeLeaseLost, code == codeFinished:
		return leaseLost(op, lease, "not the current lease")
	}
	return nil
}

// setIfEq sets key to value for px ms if it holds old, and reports whether
// it did: SET ... IFEQ, or setIfEqScript on a server without it, which the
// first refusal tells.
// With Options.WaitReplicas, acked is WAIT's verdict on the write (process).
func (s *Store) setIfEq(ctx context.Context, key string, value []byte, old string, px int64) (done bool, acked, err error) {
	c := s.enter()
	defer s.leave()
	if !s.noSetIfEq.Load() {
		cmd := redis.NewStatusCmd(ctx, "set", key, value, "ifeq", old, "px", px)
		acked := s.process(ctx, c, key, cmd)
		err := cmd.Err()
		switch {
		case errors.Is(err, redis.Nil):
			return false, nil, nil
		case !isSyntaxError(err):
			return err == nil, acked, err
		}
		s.noSetIfEq.Store(true)
	}
	if s.waitReplicas == 0 {
		n, err := setIfEqScript.Run(ctx, c, []string{key}, old, value, px).Int64()
		return n == 1, nil, err
	}
	cmd, acked := s.eval(ctx, c, setIfEqScript, key, old, value, px)
	n, err := cmd.Int64()
	return n == 1, acked, err
}

// Release implements store.Store. With out.TTL <= 0 the record is removed.
// A pause (out.RetryAfter) is judged like a lease, by the key's native TTL:
// the released record carries, in its tail, the PTTL below which it is due
// (its TTL less the pause), so the value is the worker's to compute and the
// compare-and-set of finish still writes it in one command.
func (s *Store) Release(ctx context.Context, lease store.Claim, out store.Completion) error {
	if err := requests.ValidateRetry(out); err != nil {
		return fmt.Errorf("oncemill: redis: release: %w", err)
	}
	if err := s.checkKey("release", lease.Key); err != nil {
		return err
	}
	keep := min(out.TTL, maxDuration)
	keepMS := int64(0) // 0 removes the record
	if keep > 0 {
		keepMS = millis(keep)
	}
	attempt := lease.Attempt
	if out.Uncounted {
		attempt-- // the lease's attempt given back; 0 is allowed
	}
	now := time.Now()
	next := record{Record: store.Record{Status: store.StatusRetryable, Token: lease.Token, Attempt: attempt, ExpiresAt: now.Add(keep), UpdatedAt: now}}
	if out.RetryAfter > 0 && keepMS > 0 {
		next.tail = holdBelow(keepMS, out.RetryAfter)
	}
	return s.finish(ctx, "release", lease, &next, keepMS)
}

// holdBelow is the tail of a record released for keepMS ms with a pause of
// retryAfter: the PTTL above which a claim is held back. The pause is rounded
// up to the millisecond, so that it never ends early; a pause as long as the
// record's TTL holds it back to its last millisecond (the tail 0 means no
// pause).
func holdBelow(keepMS int64, retryAfter time.Duration) time.Duration {
	pause := (min(retryAfter, maxDuration) + time.Millisecond - 1) / time.Millisecond
	return time.Duration(max(keepMS-int64(pause), 1)) * time.Millisecond
}

// Extend implements store.Store. It refuses a lease that has run out, even
// if nobody took it over yet.
func (s *Store) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if d <= 0 {
		return store.Claim{}, fmt.Errorf("oncemill: redis: extend by %v: duration must be positive: %w", d, store.ErrInvalidRequest)
	}
	if err := s.checkKey("extend", lease.Key); err != nil {
		return store.Claim{}, err
	}
	now := time.Now()
	d = min(d, maxDuration)
	cmd, acked := s.runWritten(ctx, extendScript, keysFor(s.prefix, lease.Scope, lease.Key),
		leaseHead(lease.Token), millis(d), now.Add(d).UnixMicro(), now.UnixMicro())
	code, err := cmd.Int64()
	if err != nil {
		return store.Claim{}, fail("extend", lease.Scope, lease.Key, err)
	}
	switch code {
	case codeOK:
		if acked != nil {
			return store.Claim{}, fail("extend", lease.Scope, lease.Key, acked)
		}
	case codeExpired:
		return store.Claim{}, leaseLost("extend", lease, "lease expired")
	case codeLeaseLost:
		return store.Claim{}, leaseLost("extend", lease, "not the current lease")
	}
	lease.ExpiresAt = now.Add(d)
	lease.Version = "" // the script rewrote the value
	return lease, nil
}

// Get implements store.Admin. An in-progress record whose lease has run out
// is not returned, like any other expired record.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := s.checkKey("get", key); err != nil {
		return store.Record{}, err
	}
	reply, err := s.run(ctx, getScript, keysFor(s.prefix, scope, key)).Result()
	if err != nil {
		return store.Record{}, fail("get", scope, key, err)
	}
	if r, ok := reply.([]any); ok && len(r) == 2 {
		v, _ := r[0].(string)
		pttl, _ := r[1].(int64)
		rec, err := decode(scope, key, v)
		if err != nil {
			return store.Record{}, fail("get", scope, key, err)
		}
		if rec.Status != store.StatusInProgress || time.Duration(pttl)*time.Millisecond > rec.tail {
			return rec.Record, nil
		}
	}
	return store.Record{}, fmt.Errorf("oncemill: redis: get %q/%q: %w", scope, key, store.ErrNotFound)
}

// Delete implements store.Admin: one script, which deletes the record only
// under token and says why it did not.
func (s *Store) Delete(ctx context.Context, scope, key string, token int64) error {
	if err := s.checkKey("delete", key); err != nil {
		return err
	}
	code, err := s.run(ctx, deleteScript, keysFor(s.prefix, scope, key), token).Int64()
	switch {
	case err != nil:
		return fail("delete", scope, key, err)
	case code == codeLeaseLost:
		return fmt.Errorf("oncemill: redis: delete %q/%q with token %d: the record has another token now: %w", scope, key, token, store.ErrLeaseLost)
	case code != codeOK:
		return fmt.Errorf("oncemill: redis: delete %q/%q: %w", scope, key, store.ErrNotFound)
	}
	return nil
}
