package keygen

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// storable reports whether every store can hold s as it is, as a key or a
// scope: valid UTF-8 without a NUL byte.
func storable(s string) bool {
	return strings.IndexByte(s, 0) < 0 && utf8.ValidString(s)
}

// hashedKeyPrefix starts every key StorableKey hashed. A key that arrives with it
// already is hashed too, so that a hashed key can never equal a literal one:
// a message whose UUID is the hashed form of another message's long key is
// a different key.
const hashedKeyPrefix = "hashed:sha256:"

// hashedKeyLen is the length of hashedKeyPrefix followed by 64 hex digits.
const hashedKeyLen = len(hashedKeyPrefix) + 2*sha256.Size

// StorableKey fits a key into what every store holds: a text column of max
// bytes (no limit when max <= 0). A key of at most max bytes is returned
// unchanged; a longer key, one with a NUL byte or bytes that are not UTF-8
// (PostgreSQL text holds neither), or one that starts with
// hashedKeyPrefix, is replaced by hashedKeyPrefix and the lowercase hex
// SHA-256 of the whole key (78 bytes). So the same key is stored the same
// way on every store, and no key is refused for its bytes. It never
// truncates: two long keys sharing a prefix stay distinct.
//
// The result is always 78 bytes for a hashed key, so a max below 78 still
// returns 78 bytes; give stores at least 78.
func StorableKey(key string, max int) string {
	if (max <= 0 || len(key) <= max) && storable(key) && !strings.HasPrefix(key, hashedKeyPrefix) {
		return key
	}
	return hashKey(key)
}

// hashKey is StorableKey's rare path, in a frame of its own: its buffers
// would otherwise enlarge the frame of every caller it is inlined into.
//
//go:noinline
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	var buf [hashedKeyLen]byte
	copy(buf[:], hashedKeyPrefix)
	hex.Encode(buf[len(hashedKeyPrefix):], sum[:])
	return string(buf[:])
}
