// Package keygen decides who a message is.
//
// An idempotent receiver acknowledges a redelivery without running the
// handler again, so it needs a key that is the same for every delivery of
// one logical message and different for every other message. A key that is
// too narrow (a fresh id per re-send) lets duplicates through; a key that is
// too wide (a hash of a payload without its distinguishing fields) swallows
// real messages. Choosing it is the one decision the receiver cannot make
// for you.
//
// Which generator when:
//
//   - UUID: the producer sets the Watermill message UUID once and keeps it
//     when it re-sends (Watermill publishers, outboxes). Free: no
//     allocation.
//   - Metadata: the producer sends its own idempotency key in a header.
//   - ContentHash: nobody sends a stable id, so the content is the
//     identity. The payload is canonicalised as JSON (member order,
//     whitespace, string escapes and number spelling do not matter), with
//     volatile envelope fields excluded.
//   - Composite: identity is several things at once, such as a tenant header
//     and a business id.
//   - Func: anything else, such as the Kafka topic, partition and offset.
//
// Besides the key, the receiver stores a fingerprint of the payload: the
// same key arriving with a different payload is a mismatch (a permanent
// failure), not a duplicate. The receiver picks it: a generator that
// implements Fingerprinter decides (ContentHash returns "", meaning "do not
// check", since its key is the content), any other generator gets
// PayloadFingerprint, the XXH64 of the payload bytes in hex.
//
// Errors: every reason a message has no usable key wraps ErrNoKey, and a
// sentinel per reason (ErrEmptyKey, ErrMissingMetadata, ErrNotJSON) tells
// them apart. Constructors reject options that could never work with
// oncemill.ErrInvalidConfig. Nothing here panics on any input.
//
// docs/keys.md in the repository is the user guide, with the canonical JSON
// rules in full.
package keygen
