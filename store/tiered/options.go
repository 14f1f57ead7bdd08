package tiered

import (
	"errors"
	"log/slog"
	"regexp"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/oncemill/oncemill/internal/configerr"
)

// Defaults of Options (each field's doc states its default).
const (
	defaultPrefix              = "oncemill-tiered"
	defaultLocalCapacity       = 4096
	defaultLocalMaxRecordBytes = 16 << 10
	defaultMaxLocalAge         = 10 * time.Second
	defaultRedisTimeout        = 50 * time.Millisecond
	defaultRedisBackoff        = time.Second
	defaultClockMargin         = 100 * time.Millisecond
)

// prefixRE is what Options.Prefix must match: no spaces, braces (a Redis
// Cluster hash tag) or glob characters (a SCAN pattern of an operator).
var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_\-.:/]{1,128}$`)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Prefix starts every Redis key and the invalidation channel (default
	// "oncemill-tiered"). Stores share cached records and invalidations
	// when, and only when, they share the Redis and the prefix: give stores
	// over different truths different prefixes. Letters, digits and
	// _-.:/, up to 128 bytes.
	Prefix string

	// LocalCapacity is how many finished records the in-process tier keeps
	// (default 4096), evicting the least recently used. Negative turns the
	// local tier off.
	LocalCapacity int
	// LocalMaxRecordBytes bounds the result, fingerprint and error texts of
	// a record the local tier keeps (default 16 KiB), so that its memory
	// stays below LocalCapacity × LocalMaxRecordBytes. Larger records are
	// served from Redis.
	LocalMaxRecordBytes int
	// MaxLocalAge bounds how long a record stays in the local tier after it
	// was put there (default 10s). It is how long another worker's Delete
	// can go unnoticed here when its invalidation message is lost (see the
	// package documentation).
	MaxLocalAge time.Duration

	// RedisTimeout bounds every Redis call (default 50ms), so that a
	// stalled Redis holds no delivery longer: past it a read falls back to
	// the truth. The bound travels in the call's context, which go-redis
	// honours only with ContextTimeoutEnabled (New checks).
	RedisTimeout time.Duration
	// RedisBackoff is how long the store leaves Redis alone after a failed
	// call (default 1s): reads go straight to the truth and fills are
	// dropped, so that a Redis that is down costs one timeout per
	// RedisBackoff, not one per delivery. Negative: never back off.
	RedisBackoff time.Duration

	// ClockMargin is taken off every cached lifetime (default 100ms, at
	// least 1ms): it covers the millisecond rounding of Redis TTLs and
	// leaves room for error in the clock offsets the store measures.
	ClockMargin time.Duration

	// MeterProvider provides the store's metrics (default
	// otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Logger receives the moments Redis starts failing (default: discard).
	Logger *slog.Logger
}

// withDefaults validates o and fills in the defaults. Every error says what
// to change.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, configerr.New("tiered.Options", format, args...))
	}
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if !prefixRE.MatchString(o.Prefix) {
		bad("Prefix %q is not a plain key prefix; use letters, digits and _-.:/ only, up to 128 bytes (for example %q)", o.Prefix, defaultPrefix)
	}
	if o.LocalCapacity == 0 {
		o.LocalCapacity = defaultLocalCapacity
	}
	switch {
	case o.LocalMaxRecordBytes == 0:
		o.LocalMaxRecordBytes = defaultLocalMaxRecordBytes
	case o.LocalMaxRecordBytes < 0:
		bad("LocalMaxRecordBytes is %d; use a positive size, or 0 for the default %d (turn the local tier off with a negative LocalCapacity)", o.LocalMaxRecordBytes, defaultLocalMaxRecordBytes)
	}
	switch {
	case o.MaxLocalAge == 0:
		o.MaxLocalAge = defaultMaxLocalAge
	case o.MaxLocalAge < 0:
		bad("MaxLocalAge is %v; use a positive duration, or 0 for the default %v (turn the local tier off with a negative LocalCapacity)", o.MaxLocalAge, defaultMaxLocalAge)
	}
	switch {
	case o.RedisTimeout == 0:
		o.RedisTimeout = defaultRedisTimeout
	case o.RedisTimeout < time.Millisecond:
		bad("RedisTimeout is %v; use 1ms or more, or 0 for the default %v", o.RedisTimeout, defaultRedisTimeout)
	}
	if o.RedisBackoff == 0 {
		o.RedisBackoff = defaultRedisBackoff
	}
	switch {
	case o.ClockMargin == 0:
		o.ClockMargin = defaultClockMargin
	case o.ClockMargin < time.Millisecond:
		bad("ClockMargin is %v; use 1ms or more (Redis TTLs are whole milliseconds), or 0 for the default %v", o.ClockMargin, defaultClockMargin)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, errors.Join(errs...)
}
