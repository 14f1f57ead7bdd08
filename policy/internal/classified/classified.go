// Package classified holds the marker policy.Cached and policy.Retryable
// wrap an error in. It lives apart so that its methods are not part of
// package policy's API: a user classifies errors through policy only.
package classified

// Error marks Err with a class (a policy.Class). errors.As finds the
// outermost marker, so re-wrapping with another marker overrides an inner
// one.
type Error struct {
	Err   error
	Class int
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }
