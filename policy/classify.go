package policy

import (
	"errors"

	"github.com/oncemill/oncemill/policy/internal/classified"
)

// Class is what a failure is: remembered and acked, or released and retried.
type Class int

const (
	// ClassRetryable failures release the key and nack, so the redelivery
	// runs again (until MaxAttempts). Unknown errors are retryable.
	ClassRetryable Class = iota
	// ClassCached failures are stored for FailureTTL and acked; duplicates
	// get the stored failure and the handler is not run again.
	ClassCached
)

func (c Class) String() string {
	if c == ClassCached {
		return "cached"
	}
	return "retryable"
}

// Cached marks err as a cached failure: it is stored and never re-run.
// Cached(nil) is nil.
func Cached(err error) error {
	if err == nil {
		return nil
	}
	return &classified.Error{Err: err, Class: int(ClassCached)}
}

// Retryable marks err as retryable even when it would otherwise be cached.
// Retryable(nil) is nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &classified.Error{Err: err, Class: int(ClassRetryable)}
}

// Classify sorts err. The order, first match wins:
//  1. the Classifier predicate, when it returns ok;
//  2. the outermost Cached or Retryable marker (re-wrapping with another
//     marker overrides an inner one);
//  3. RetryableErrors, then CachedErrors, by errors.Is;
//  4. anything else, context cancellation and deadlines included, is retryable.
func (p Policy) Classify(err error) Class {
	if err == nil {
		return ClassRetryable
	}
	if p.Classifier != nil {
		if c, ok := p.Classifier(err); ok {
			return c
		}
	}
	var marked *classified.Error
	if errors.As(err, &marked) {
		return Class(marked.Class)
	}
	for _, target := range p.RetryableErrors {
		if errors.Is(err, target) {
			return ClassRetryable
		}
	}
	for _, target := range p.CachedErrors {
		if errors.Is(err, target) {
			return ClassCached
		}
	}
	return ClassRetryable
}
