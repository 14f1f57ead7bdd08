package keygen

import (
	"fmt"
)

// Every "this message carries no usable key" sentinel wraps ErrNoKey, so a
// caller can test for the family with one errors.Is and for the reason with
// another.
var (
	// ErrMissingMetadata: the metadata field a generator reads is missing
	// or empty. The error returned wraps it and names the field.
	ErrMissingMetadata = fmt.Errorf("%w: metadata field is missing or empty", ErrNoKey)

	// ErrNotJSON: ContentHash with RejectNonJSON got a payload that is not
	// JSON it can canonicalise. The wrapping error says where and why.
	ErrNotJSON = fmt.Errorf("%w: payload is not valid JSON", ErrNoKey)

	// ErrEmptyKey: the key is empty: a generator returned "" without an
	// error, or UUID() got a message without a UUID. An empty key would make
	// every such message the same message, so it is no key.
	ErrEmptyKey = fmt.Errorf("%w: the key is empty", ErrNoKey)

	// errEmptyUUID is UUID()'s ErrEmptyKey.
	errEmptyUUID = fmt.Errorf("%w: the message UUID is empty", ErrEmptyKey)

	// errNilMessage keeps every generator panic-free when handed nil.
	errNilMessage = fmt.Errorf("%w: message is nil", ErrNoKey)
)
