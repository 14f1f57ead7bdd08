package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oncemill/oncemill/store"
)

// A record is one Redis string, so that ClaimLease of a new key is one plain
// SET NX and expiry is Redis's own:
//
//	1|<status>|<token>|<attempt>|<tail ms>|<expires µs>|<updated µs>|<n>:<error kind><n>:<error message><result><created µs>[#<n>:<message UUID>]|<fingerprint><LLLL>
//
// 1 is the layout's version: a later layout reads it and migrates. status
// is one letter: p in progress, s succeeded, f failed, r retryable. The
// error fields carry their byte length, so any bytes fit, and the result
// runs to the part that never changes while the record lives: the creation
// time, the claiming message's UUID and the fingerprint, whose length LLLL
// (4 hex digits) ends the value. Every claim writes the whole value, so the
// UUID, the last claimer's, can sit in that part. It is left out when
// empty, so a record without one reads as before; a worker of an earlier
// version cannot read a record that has one (its creation time does not
// parse).
// So a script that finishes a lease checks the head ("1|p|<token>|"),
// keeps the tail, and replaces the rest with what the worker sends: two
// string.sub calls, no pattern.
//
// Visibility is the key's existence, judged by Redis's clock through the
// native TTL (PX): a finished or released record's TTL is its outcome's, an
// in-progress record's is its lease plus tail, the time an expired lease
// keeps its attempt count (the ClaimLease's Retain). A lease is live while the
// key's PTTL is above its tail. A released record's tail is its pause
// (store.Completion.RetryAfter), by the same rule: a claim is held back while
// the key's PTTL is above it, and 0, what a release without a pause and
// every release before pauses existed wrote, holds nothing back (a worker of
// an earlier version ignores a pause: it takes the key). The times in the
// value are the worker's clock, for Record and Lease only: nothing is
// decided by them. Record.RetryAt is one of them: the expiry less the
// tail.
const layoutVersion = '1'

// Status letters of the layout.
const (
	letterInProgress = 'p'
	letterSucceeded  = 's'
	letterFailed     = 'f'
	letterRetryable  = 'r'
)

// record is a decoded value: the store.Record and the tail (for a released
// record, the PTTL above which it holds its next attempt back; 0: none).
type record struct {
	store.Record
	tail time.Duration
}

func statusLetter(s store.Status) byte {
	switch s {
	case store.StatusInProgress:
		return letterInProgress
	case store.StatusSucceeded:
		return letterSucceeded
	case store.StatusCachedFailure:
		return letterFailed
	}
	return letterRetryable
}

// maxStableLen bounds the creation time, message UUID and fingerprint,
// whose length takes 4 hex digits.
const maxStableLen = 0xffff

// uuidMark follows the creation time when a message UUID comes next.
const uuidMark = '#'

// unstable returns r's value up to its stable part: the head, the error
// fields and the result, in one allocation with room for extra bytes more.
func unstable(r *record, extra int) []byte {
	b := make([]byte, 0, 96+2*(20+1)+len(r.ErrorKind)+len(r.ErrorMessage)+len(r.Result)+extra)
	b = append(b, layoutVersion, '|', statusLetter(r.Status))
	for _, n := range [...]int64{r.Token, int64(r.Attempt), r.tail.Milliseconds(), r.ExpiresAt.UnixMicro(), r.UpdatedAt.UnixMicro()} {
		b = append(b, '|')
		b = strconv.AppendInt(b, n, 10)
	}
	b = append(b, '|')
	b = appendField(b, string(r.ErrorKind))
	b = appendField(b, r.ErrorMessage)
	return append(b, r.Result...)
}

// leaseHead is what an in-progress record under token starts with.
func leaseHead(token int64) string {
	return "1|p|" + strconv.FormatInt(token, 10) + "|"
}

// stable is the part that never changes while the record lives.
func stable(b []byte, created time.Time, messageUUID, fingerprint string) []byte {
	start := len(b)
	b = strconv.AppendInt(b, created.UnixMicro(), 10)
	if messageUUID != "" {
		b = append(b, uuidMark)
		b = appendField(b, messageUUID)
	}
	b = append(b, '|')
	b = append(b, fingerprint...)
	n := len(b) - start // at most maxStableLen: ClaimLease bounds the fingerprint
	const hex = "0123456789abcdef"
	return append(b, hex[n>>12&0xf], hex[n>>8&0xf], hex[n>>4&0xf], hex[n&0xf])
}

// leaseStable returns the part of l.Version that never changes while the
// record lives (stable), and false unless l.Version is an in-progress value
// of layout 1 under l.Token: a Version is trusted only with its own token.
func leaseStable(l store.Claim) (string, bool) {
	v := l.Version
	var buf [32]byte
	head := strconv.AppendInt(append(buf[:0], layoutVersion, '|', letterInProgress, '|'), l.Token, 10)
	if len(v) < len(head)+5 || v[:len(head)] != string(head) || v[len(head)] != '|' {
		return "", false
	}
	n, err := strconv.ParseUint(v[len(v)-4:], 16, 16)
	if err != nil || int(n)+4 > len(v)-len(head) {
		return "", false
	}
	return v[len(v)-4-int(n):], true
}

// encode returns r's value.
func encode(r *record) []byte {
	b := unstable(r, 20+1+len(r.Fingerprint)+4+len(r.MessageUUID)+8)
	return stable(b, r.CreatedAt, r.MessageUUID, r.Fingerprint)
}

func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

var errLayout = errors.New("not a record of layout 1")

// decode reads a value of scope/key.
func decode(scope, key, v string) (record, error) {
	r := record{Record: store.Record{Scope: scope, Key: key}}
	if len(v) < 8 || v[0] != layoutVersion || v[1] != '|' || v[3] != '|' {
		return r, fmt.Errorf("%w: %.24q", errLayout, v)
	}
	n, err := strconv.ParseUint(v[len(v)-4:], 16, 16)
	if err != nil || int(n)+8 > len(v) {
		return r, fmt.Errorf("%w: stable part", errLayout)
	}
	rest, fixed := v[4:len(v)-4-int(n)], v[len(v)-4-int(n):len(v)-4]
	end := strings.IndexAny(fixed, "|#")
	if end < 0 {
		return r, fmt.Errorf("%w: created", errLayout)
	}
	c, err := strconv.ParseInt(fixed[:end], 10, 64)
	if err != nil {
		return r, fmt.Errorf("%w: created", errLayout)
	}
	fixed = fixed[end:]
	if fixed[0] == uuidMark {
		if r.MessageUUID, fixed, err = readField(fixed[1:]); err != nil {
			return r, err
		}
		if fixed == "" || fixed[0] != '|' {
			return r, fmt.Errorf("%w: message UUID", errLayout)
		}
	}
	r.CreatedAt, r.Fingerprint = time.UnixMicro(c), fixed[1:]
	switch v[2] {
	case letterInProgress:
		r.Status = store.StatusInProgress
	case letterSucceeded:
		r.Status = store.StatusSucceeded
	case letterFailed:
		r.Status = store.StatusCachedFailure
	case letterRetryable:
		r.Status = store.StatusRetryable
	default:
		return r, fmt.Errorf("%w: status %q", errLayout, v[2])
	}
	var nums [5]int64
	for i := range nums {
		field, after, ok := strings.Cut(rest, "|")
		n, err := strconv.ParseInt(field, 10, 64)
		if !ok || err != nil {
			return r, fmt.Errorf("%w: number %d", errLayout, i)
		}
		nums[i], rest = n, after
	}
	r.Token, r.Attempt, r.tail = nums[0], int(nums[1]), time.Duration(nums[2])*time.Millisecond
	r.ExpiresAt, r.UpdatedAt = time.UnixMicro(nums[3]), time.UnixMicro(nums[4])
	var kind string
	if kind, rest, err = readField(rest); err != nil {
		return r, err
	}
	r.ErrorKind = store.ErrorKind(kind)
	if r.ErrorMessage, rest, err = readField(rest); err != nil {
		return r, err
	}
	if rest != "" {
		r.Result = []byte(rest)
	}
	switch {
	case r.Status == store.StatusInProgress:
		r.LeaseExpiresAt = r.ExpiresAt
	case r.Status == store.StatusRetryable && r.tail > 0:
		r.RetryAt = r.ExpiresAt.Add(-r.tail)
	}
	return r, nil
}

func readField(s string) (field, rest string, err error) {
	n, after, ok := strings.Cut(s, ":")
	size, perr := strconv.Atoi(n)
	if !ok || perr != nil || size < 0 || size > len(after) {
		return "", "", fmt.Errorf("%w: field length %.12q", errLayout, n)
	}
	return after[:size], after[size:], nil
}
