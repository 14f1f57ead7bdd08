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
	// or empty. The error returned wraps it and names the field.
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
