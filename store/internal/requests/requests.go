// Package requests checks and pages the requests oncemill's stores serve,
// so that every store refuses the same requests with the same
// store.ErrInvalidRequest and lists with the same cursor.
package requests

import (
	"cmp"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/oncemill/oncemill/store"
)

// ValidateLease reports a lease request no store can serve.
func ValidateLease(r store.LeaseRequest) error {
	if r.Key == "" {
		return fmt.Errorf("%w: empty key", store.ErrInvalidRequest)
	}
	if r.LeaseDuration <= 0 {
		return fmt.Errorf("%w: lease duration must be positive", store.ErrInvalidRequest)
	}
	return nil
}

// ValidateTx reports a claim request of the one-transaction mode no store
// can serve.
func ValidateTx(r store.TxRequest) error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: empty key", store.ErrInvalidRequest)
	case r.SuccessTTL <= 0:
		return fmt.Errorf("%w: success TTL must be positive", store.ErrInvalidRequest)
	case r.Retain < 0:
		return fmt.Errorf("%w: retain must not be negative", store.ErrInvalidRequest)
	case r.Wait <= 0:
		return fmt.Errorf("%w: wait must be positive", store.ErrInvalidRequest)
	}
	return nil
}

// ValidateCompletion reports an outcome no store can record.
func ValidateCompletion(o store.Completion) error {
	if o.Status != store.StatusSucceeded && o.Status != store.StatusCachedFailure {
		return fmt.Errorf("%w: completion status must be succeeded or cached_failure, not %v", store.ErrInvalidRequest, o.Status)
	}
	if o.TTL <= 0 {
		return fmt.Errorf("%w: outcome TTL must be positive", store.ErrInvalidRequest)
	}
	return nil
}

// ValidateRetry reports a release no store can record: Store.Release and a
// retryable Transactional.RecordRollback.
func ValidateRetry(o store.Completion) error {
	switch {
	case o.Status != store.StatusRetryable:
		return fmt.Errorf("%w: release status must be retryable, not %v", store.ErrInvalidRequest, o.Status)
	case o.RetryAfter < 0:
		return fmt.Errorf("%w: retry-after %v is negative", store.ErrInvalidRequest, o.RetryAfter)
	case o.TTL > 0 && o.RetryAfter > o.TTL:
		return fmt.Errorf("%w: retry-after %v outlives the record's TTL %v", store.ErrInvalidRequest, o.RetryAfter, o.TTL)
	}
	return nil
}

// defaultListLimit is the page size of a ListRequest without a Limit.
const defaultListLimit = 100

// Cursor is the After of a page that continues past (scope, key): an
// opaque, printable string, for stores that list in (scope, key) order.
func Cursor(scope, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(scope + "\x00" + key))
}

// Page validates r and returns where its page starts, after (afterScope,
// afterKey) in (scope, key) order (both empty: from the first record), and
// how many records it holds at most.
func Page(r store.ListRequest) (afterScope, afterKey string, limit int, err error) {
	if r.Limit < 0 {
		return "", "", 0, fmt.Errorf("%w: list limit %d is negative; use 0 for %d", store.ErrInvalidRequest, r.Limit, defaultListLimit)
	}
	b, err := base64.RawURLEncoding.DecodeString(r.After)
	if err != nil {
		return "", "", 0, fmt.Errorf("%w: list cursor %q is not one a List returned", store.ErrInvalidRequest, r.After)
	}
	afterScope, afterKey, ok := strings.Cut(string(b), "\x00")
	if !ok && r.After != "" {
		return "", "", 0, fmt.Errorf("%w: list cursor %q is not one a List returned", store.ErrInvalidRequest, r.After)
	}
	return afterScope, afterKey, cmp.Or(r.Limit, defaultListLimit), nil
}

// Matches reports whether rec is selected by r's filters (not its page).
func Matches(r store.ListRequest, rec store.Record) bool {
	return (r.Scope == "" || rec.Scope == r.Scope) &&
		(r.Status == 0 || rec.Status == r.Status) &&
		(r.UpdatedBefore.IsZero() || rec.UpdatedAt.Before(r.UpdatedBefore)) &&
		(r.MessageUUID == "" || rec.MessageUUID == r.MessageUUID)
}
