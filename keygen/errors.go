package keygen

import (
	"fmt"
)

// Every "this message carries no usable key" sentinel wraps ErrNoKey, so a
// caller can test for the family with one errors.Is and for the reason with
// another.
var (
	// ErrEmptyUUID: the message has no UUID, so UUID() cannot key it.
	ErrEmptyUUID = fmt.Errorf("%w: message UUID is empty", ErrNoKey)

	// ErrMissingMetadata: the metadata field a generator reads is missing
	// or empty. The error returned is a *MissingMetadataError naming it.
	ErrMissingMetadata = fmt.Errorf("%w: metadata field is missing or empty", ErrNoKey)

	// ErrNotJSON: ContentHash with RejectNonJSON got a payload that is not
	// JSON it can canonicalise. The wrapping error says where and why.
	ErrNotJSON = fmt.Errorf("%w: payload is not valid JSON", ErrNoKey)

	// ErrEmptyKey: a generator returned "" without an error. An empty key
	// would make every such message the same message, so it is no key.
	ErrEmptyKey = fmt.Errorf("%w: generator returned an empty key", ErrNoKey)

	// errNilMessage keeps every generator panic-free when handed nil.
	errNilMessage = fmt.Errorf("%w: message is nil", ErrNoKey)
)

// MissingMetadataError is returned by a Metadata generator when the message
// lacks the field. It matches ErrMissingMetadata and ErrNoKey with errors.Is.
type MissingMetadataError struct {
	Field string
}

func (e *MissingMetadataError) Error() string {
	return fmt.Sprintf("oncemill: no key: metadata field %q is missing or empty", e.Field)
}

// Unwrap returns ErrMissingMetadata, which itself wraps ErrNoKey.
func (e *MissingMetadataError) Unwrap() error { return ErrMissingMetadata }
