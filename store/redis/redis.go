package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncemill/oncemill"

	goredis "github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
)

const (
	defaultPrefix         = "oncemill"
	maxPrefixLen          = 128
	defaultMaxKeyLen      = 512
	defaultMaxResultBytes = 1 << 20
	// maxResultBytes is Redis's default proto-max-bulk-len: no single
	// argument may be longer.
	maxResultBytes    = 512 << 20
	defaultLeaseGrace = time.Hour
	scanCount         = 1000
)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Prefix starts every key the store writes (default "oncemill"). Stores
	// with different prefixes share nothing, not even DeleteExpired. It may
	// hold letters, digits and "_-.:/", up to 128 bytes: no spaces, no braces
	// (they would change the Redis Cluster hash tag) and no glob characters
	// (they would change what DeleteExpired scans).
	Prefix string
	// MaxKeyLen is the longest key in bytes that Begin accepts (default 512,
	// see store.Limits). Longer keys are refused with
	// store.ErrInvalidRequest: callers hash them with keygen.StorableKey instead of
	// truncating them.
	MaxKeyLen int
	// MaxResultBytes is the largest Outcome.Result that Complete stores
	// (default 1 MiB, at most 512 MiB, Redis's largest argument). Larger
	// results are refused with store.ErrInvalidRequest.
	MaxResultBytes int
	// LeaseGrace is how long Redis keeps the record of an expired lease
	// after the lease ran out (default 1h; negative: not at all), or the
	// Begin's Retain when that is longer. Until then the next Begin of the
	// key takes it over with attempt n+1, so attempts are counted across a
	// worker crash; afterwards the key starts again at attempt 1. The record
	// is invisible to Get either way. (An Extend sets the grace back to
	// LeaseGrace.)
	LeaseGrace time.Duration
	// AutoPipeline sends the scripts of concurrent calls through go-redis's
	// AutoPipeliner (client.AutoPipeline(), experimental in go-redis v9.23),
	// so that the calls of many handler goroutines share round trips instead
	// of taking one each. It raises throughput with many concurrent handlers
	// and gains nothing for one. Each script stays one atomic step with its
	// own reply, so the contract is the same either way. Not available on a
	// *redis.Ring.
	AutoPipeline bool
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
		return o, oncemill.InvalidConfig("redis.Options", "MaxKeyLen is %d; use a positive length, or 0 for the default %d", o.MaxKeyLen, defaultMaxKeyLen)
	}
	switch {
	case o.MaxResultBytes == 0:
		o.MaxResultBytes = defaultMaxResultBytes
	case o.MaxResultBytes < 0:
		return o, oncemill.InvalidConfig("redis.Options", "MaxResultBytes is %d; use a positive size, or 0 for the default %d (1 MiB)", o.MaxResultBytes, defaultMaxResultBytes)
	case o.MaxResultBytes > maxResultBytes:
		return o, oncemill.InvalidConfig("redis.Options", "MaxResultBytes is %d; Redis takes arguments of at most %d bytes (512 MiB): use that or less", o.MaxResultBytes, maxResultBytes)
	}
	switch {
	case o.LeaseGrace == 0:
		o.LeaseGrace = defaultLeaseGrace
	case o.LeaseGrace < 0:
		o.LeaseGrace = 0
	}
	return o, nil
}

func validPrefix(p string) error {
	if len(p) > maxPrefixLen {
		return oncemill.InvalidConfig("redis.Options", "Prefix is %d bytes; use at most %d", len(p), maxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '_', c == '-', c == '.', c == ':', c == '/':
		default:
			return oncemill.InvalidConfig("redis.Options", "Prefix %q has %q at byte %d; use only letters, digits and _-.:/ (no spaces, braces or glob characters), e.g. %q",
				p, c, i, defaultPrefix)
		}
	}
	return nil
}

// Store is a store.Store on Redis, shared by every worker that uses the same
// Redis and Prefix. It is safe for concurrent use. It does not own the
// client: close the client when done.
type Store struct {
	client goredis.UniversalClient
	// scripts runs the scripts: the client, or its AutoPipeliner.
	scripts        goredis.Scripter
	prefix         string
	maxKeyLen      int
	maxResultBytes int
	graceMS        int64

	closed atomic.Bool

	// offsetUS is added to the server's clock by every script. Only tests set
	// it (see export_test.go), to move the store's clock forward.
	offsetUS atomic.Int64
}

var (
	_ store.Store = (*Store)(nil)
	_ store.Admin = (*Store)(nil)
)

// New returns a store over client configured by opts. It does not contact
// Redis; the first operation does.
func New(client goredis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("oncemill: redis: New: client is nil; pass a *redis.Client (redis.NewClient) or *redis.ClusterClient")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var scripts goredis.Scripter = client
	if opts.AutoPipeline {
		ap, err := client.AutoPipeline()
		if err != nil {
			return nil, oncemill.InvalidConfig("redis.Options.AutoPipeline", "%w; use a *redis.Client or *redis.ClusterClient, or turn AutoPipeline off", err)
		}
		scripts = ap
	}
	slotTags() // build the tag table now rather than in the first Begin
	return &Store{
		client:         client,
		scripts:        scripts,
		prefix:         opts.Prefix,
		maxKeyLen:      opts.MaxKeyLen,
		maxResultBytes: opts.MaxResultBytes,
		graceMS:        min(opts.LeaseGrace, maxDuration).Milliseconds(),
	}, nil
}

// Limits implements store.Store: Options.MaxKeyLen and
// Options.MaxResultBytes.
func (s *Store) Limits() store.Limits {
	return store.Limits{MaxKeyLen: s.maxKeyLen, MaxResultBytes: s.maxResultBytes}
}

// Close makes every later operation return store.ErrClosed and stops the
// AutoPipeliner, if Options.AutoPipeline started one. The client stays the
// caller's to close. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if ap, ok := s.scripts.(*goredis.AutoPipeliner); ok {
		return ap.Close()
	}
	return nil
}

func (s *Store) checkOpen(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("oncemill: redis: %s: %w", op, store.ErrClosed)
	}
	return nil
}

// Prefix returns the key prefix in use.
func (s *Store) Prefix() string { return s.prefix }

// maxDuration bounds every lease, TTL and keep. The scripts add durations
// in microseconds to the server time in Lua's doubles, which are exact only
// below 2^53 µs (year 2255): a duration of "forever" (math.MaxInt64 is 292
// years) counts as 100 years.
const maxDuration = 100 * 365 * 24 * time.Hour

// micros rounds d up to whole microseconds, the scripts' unit.
func micros(d time.Duration) int64 {
	d = min(d, maxDuration)
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// millis rounds d up to whole milliseconds (at least 1), PEXPIRE's unit:
// the native TTL never fires before the stored expiry.
func millis(d time.Duration) int64 {
	d = min(d, maxDuration)
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	return max(ms, 1)
}

func (s *Store) offset() string { return strconv.FormatInt(s.offsetUS.Load(), 10) }

// fail wraps a Redis error with the operation. A closed client reads as
// store.ErrClosed.
func fail(op, scope, key string, err error) error {
	if errors.Is(err, goredis.ErrClosed) {
		return fmt.Errorf("oncemill: redis: %s %q/%q: %w: %w", op, scope, key, store.ErrClosed, err)
	}
	return fmt.Errorf("oncemill: redis: %s %q/%q: %w", op, scope, key, err)
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

// Begin implements store.Store.
func (s *Store) Begin(ctx context.Context, req store.BeginRequest) (store.BeginResult, error) {
	if err := s.checkOpen("begin"); err != nil {
		return store.BeginResult{}, err
	}
	if err := req.Validate(); err != nil {
		return store.BeginResult{}, fmt.Errorf("oncemill: redis: begin: %w", err)
	}
	if len(req.Key) > s.maxKeyLen {
		return store.BeginResult{}, fmt.Errorf("oncemill: redis: begin: key is %d bytes, longer than MaxKeyLen %d; hash long keys with keygen.StorableKey: %w",
			len(req.Key), s.maxKeyLen, store.ErrInvalidRequest)
	}
	k := keysFor(s.prefix, req.Scope, req.Key)
	reply, err := beginScript.Run(ctx, s.scripts, []string{k.record, k.token},
		s.offset(), req.Fingerprint, micros(req.Lease), millis(req.Lease)+max(s.graceMS, req.Retain.Milliseconds()), micros(req.Retain)).Slice()
	if err != nil {
		return store.BeginResult{}, fail("begin", req.Scope, req.Key, err)
	}
	res, err := decodeBegin(req, reply)
	if err != nil {
		return store.BeginResult{}, fail("begin", req.Scope, req.Key, err)
	}
	return res, nil
}

func decodeBegin(req store.BeginRequest, reply []any) (store.BeginResult, error) {
	if len(reply) == 0 {
		return store.BeginResult{}, errors.New("empty script reply")
	}
	var d store.Decision
	switch code, _ := reply[0].(int64); code {
	case codeExecute:
		if len(reply) != 5 {
			return store.BeginResult{}, fmt.Errorf("execute reply has %d elements, want 5", len(reply))
		}
		var p parser
		l := store.Lease{
			Scope:     req.Scope,
			Key:       req.Key,
			Token:     p.int(reply[1]),
			Attempt:   int(p.int(reply[2])),
			ExpiresAt: p.time(reply[3]),
		}
		takeover := p.int(reply[4]) == 1
		if p.err != nil {
			return store.BeginResult{}, p.err
		}
		return store.BeginResult{Decision: store.DecisionExecute, Lease: l, Takeover: takeover}, nil
	case codeReplay:
		d = store.DecisionReplay
	case codeInProgress:
		d = store.DecisionHeld
	case codeMismatch:
		d = store.DecisionMismatch
	default:
		return store.BeginResult{}, fmt.Errorf("unexpected script reply %v", reply[0])
	}
	rec, err := decodeRecord(req.Scope, req.Key, reply[1:])
	if err != nil {
		return store.BeginResult{}, err
	}
	return store.BeginResult{Decision: d, Record: &rec}, nil
}

// parser reads script reply values, keeping the first error.
type parser struct{ err error }

func (p *parser) int(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil && p.err == nil {
			p.err = fmt.Errorf("bad number %q in script reply", v)
		}
		return n
	case nil:
		return 0
	}
	if p.err == nil {
		p.err = fmt.Errorf("unexpected %T in script reply", v)
	}
	return 0
}

func (p *parser) time(v any) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.UnixMicro(p.int(v))
}

func (p *parser) str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	}
	if p.err == nil {
		p.err = fmt.Errorf("unexpected %T in script reply", v)
	}
	return ""
}

func (p *parser) bytes(v any) []byte {
	if s := p.str(v); s != "" {
		return []byte(s)
	}
	return nil
}

// decodeRecord reads the fields in the order of recordFields.
func decodeRecord(scope, key string, f []any) (store.Record, error) {
	if len(f) != 10 {
		return store.Record{}, fmt.Errorf("record reply has %d fields, want 10", len(f))
	}
	var p parser
	status, err := parseStatus(p.str(f[0]))
	if err != nil {
		return store.Record{}, err
	}
	r := store.Record{
		Scope:        scope,
		Key:          key,
		Status:       status,
		Token:        p.int(f[1]),
		Attempt:      int(p.int(f[2])),
		Fingerprint:  p.str(f[3]),
		ExpiresAt:    p.time(f[4]),
		CreatedAt:    p.time(f[5]),
		UpdatedAt:    p.time(f[6]),
		Result:       p.bytes(f[7]),
		ErrorKind:    p.str(f[8]),
		ErrorMessage: p.str(f[9]),
	}
	if status == store.StatusInProgress {
		r.LeaseExpiresAt = r.ExpiresAt
	}
	return r, p.err
}

func parseStatus(s string) (store.Status, error) {
	switch s {
	case "in_progress":
		return store.StatusInProgress, nil
	case "succeeded":
		return store.StatusSucceeded, nil
	case "failed":
		return store.StatusFailed, nil
	case "retryable":
		return store.StatusRetryable, nil
	}
	return 0, fmt.Errorf("unknown stored status %q", s)
}

// leaseLost is the error of a lease that is not current.
func leaseLost(op string, l store.Lease, why string) error {
	return fmt.Errorf("oncemill: redis: %s %q/%q with token %d: %s: %w", op, l.Scope, l.Key, l.Token, why, store.ErrLeaseLost)
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, lease store.Lease, out store.Completion) error {
	if err := out.Validate(); err != nil {
		return fmt.Errorf("oncemill: redis: complete: %w", err)
	}
	if err := s.checkKey("complete", lease.Key); err != nil {
		return err
	}
	if len(out.Result) > s.maxResultBytes {
		return fmt.Errorf("oncemill: redis: complete %q/%q: result is %d bytes, larger than MaxResultBytes %d; store less, or raise Options.MaxResultBytes: %w",
			lease.Scope, lease.Key, len(out.Result), s.maxResultBytes, store.ErrInvalidRequest)
	}
	k := keysFor(s.prefix, lease.Scope, lease.Key)
	code, err := completeScript.Run(ctx, s.scripts, []string{k.record},
		s.offset(), lease.Token, out.Status.String(), out.Result, out.ErrorKind, out.ErrorMessage,
		micros(out.TTL), millis(out.TTL)).Int64()
	if err != nil {
		return fail("complete", lease.Scope, lease.Key, err)
	}
	switch code {
	case codeOK:
		return nil
	case codeLeaseLost:
		return leaseLost("complete", lease, "not the current lease")
	}
	return fail("complete", lease.Scope, lease.Key, fmt.Errorf("unexpected script reply %d", code))
}

// Release implements store.Store. With keep <= 0 the record is removed.
func (s *Store) Release(ctx context.Context, lease store.Lease, keep time.Duration) error {
	if err := s.checkKey("release", lease.Key); err != nil {
		return err
	}
	keepUS := int64(0)
	if keep > 0 {
		keepUS = micros(keep)
	}
	k := keysFor(s.prefix, lease.Scope, lease.Key)
	code, err := releaseScript.Run(ctx, s.scripts, []string{k.record},
		s.offset(), lease.Token, keepUS, millis(keep)).Int64()
	if err != nil {
		return fail("release", lease.Scope, lease.Key, err)
	}
	switch code {
	case codeOK:
		return nil
	case codeLeaseLost:
		return leaseLost("release", lease, "not the current lease")
	}
	return fail("release", lease.Scope, lease.Key, fmt.Errorf("unexpected script reply %d", code))
}

// Extend implements store.Store. It refuses a lease that has expired, even
// if nobody took it over yet.
func (s *Store) Extend(ctx context.Context, lease store.Lease, d time.Duration) (store.Lease, error) {
	if d <= 0 {
		return store.Lease{}, fmt.Errorf("oncemill: redis: extend by %v: duration must be positive: %w", d, store.ErrInvalidRequest)
	}
	if err := s.checkKey("extend", lease.Key); err != nil {
		return store.Lease{}, err
	}
	k := keysFor(s.prefix, lease.Scope, lease.Key)
	reply, err := extendScript.Run(ctx, s.scripts, []string{k.record},
		s.offset(), lease.Token, micros(d), millis(d)+s.graceMS).Result()
	if err != nil {
		return store.Lease{}, fail("extend", lease.Scope, lease.Key, err)
	}
	switch reply := reply.(type) {
	case int64:
		switch reply {
		case codeLeaseLost:
			return store.Lease{}, leaseLost("extend", lease, "not the current lease")
		case codeExpired:
			return store.Lease{}, leaseLost("extend", lease, "lease expired")
		}
	case []any:
		if len(reply) == 3 {
			var p parser
			out := store.Lease{
				Scope:     lease.Scope,
				Key:       lease.Key,
				Token:     lease.Token,
				ExpiresAt: p.time(reply[1]),
				Attempt:   int(p.int(reply[2])),
			}
			if p.err != nil {
				return store.Lease{}, fail("extend", lease.Scope, lease.Key, p.err)
			}
			return out, nil
		}
	}
	return store.Lease{}, fail("extend", lease.Scope, lease.Key, fmt.Errorf("unexpected script reply %v", reply))
}

// Get implements store.Store. An in-progress record whose lease has expired
// is not returned, like any other expired record.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := s.checkKey("get", key); err != nil {
		return store.Record{}, err
	}
	k := keysFor(s.prefix, scope, key)
	reply, err := getScript.Run(ctx, s.scripts, []string{k.record}, s.offset()).Result()
	if err != nil {
		return store.Record{}, fail("get", scope, key, err)
	}
	switch reply := reply.(type) {
	case int64:
		if reply == codeNotFound {
			return store.Record{}, fmt.Errorf("oncemill: redis: get %q/%q: %w", scope, key, store.ErrNotFound)
		}
	case []any:
		if len(reply) > 0 {
			rec, err := decodeRecord(scope, key, reply[1:])
			if err != nil {
				return store.Record{}, fail("get", scope, key, err)
			}
			return rec, nil
		}
	}
	return store.Record{}, fail("get", scope, key, fmt.Errorf("unexpected script reply %v", reply))
}

// Delete implements store.Store. The slot's token counter stays, so the
// key's next lease still gets a larger token.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := s.checkKey("delete", key); err != nil {
		return err
	}
	k := keysFor(s.prefix, scope, key)
	if err := s.client.Del(ctx, k.record).Err(); err != nil {
		return fail("delete", scope, key, err)
	}
	return nil
}

// DeleteExpired implements store.Store. Redis removes records by their
// native TTLs without help; what this finds is the rest: expired leases kept
// for LeaseGrace (after which their key starts again at attempt 1), and
// records whose TTL is about to fire. It SCANs every key under the prefix
// (on every master of a cluster), so its cost grows with the number of
// records, not with limit: there is no need to run it on a schedule.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if err := s.checkOpen("delete expired"); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, fmt.Errorf("oncemill: redis: delete expired: limit is %d, must be positive: %w", limit, store.ErrInvalidRequest)
	}
	var (
		mu      sync.Mutex // one node at a time: the limit is shared
		removed int
	)
	node := func(ctx context.Context, c goredis.Cmdable) error {
		mu.Lock()
		defer mu.Unlock()
		n, err := s.deleteExpiredOn(ctx, c, limit-removed)
		removed += n
		return err
	}
	if err := s.eachNode(ctx, node); err != nil {
		return removed, fmt.Errorf("oncemill: redis: delete expired: %w", err)
	}
	return removed, nil
}

// deleteExpiredOn scans one node and removes up to limit expired records.
func (s *Store) deleteExpiredOn(ctx context.Context, c goredis.Cmdable, limit int) (int, error) {
	removed := 0
	pattern := recordPattern(s.prefix)
	var cursor uint64
	for removed < limit {
		keys, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
		if err != nil {
			return removed, err
		}
		for len(keys) > 0 && removed < limit {
			// Never ask more than we may remove: each script may remove one.
			batch := keys[:min(len(keys), limit-removed)]
			keys = keys[len(batch):]
			cmds, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
				off := s.offset()
				for _, key := range batch {
					// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT.
					deleteExpiredScript.Eval(ctx, p, []string{key}, off)
				}
				return nil
			})
			if err != nil {
				return removed, err
			}
			for _, cmd := range cmds {
				if n, _ := cmd.(*goredis.Cmd).Int64(); n == 1 {
					removed++
				}
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	return removed, nil
}
