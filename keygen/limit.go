package keygen

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// HashedKeyPrefix starts every key Limit hashed. A key that arrives with it
// already is hashed too, so that a hashed key can never equal a literal one:
// a message whose UUID is the hashed form of another message's long key is
// a different key.
const HashedKeyPrefix = "hashed:sha256:"

// hashedKeyLen is the length of HashedKeyPrefix followed by 64 hex digits.
const hashedKeyLen = len(HashedKeyPrefix) + 2*sha256.Size

// Limit fits a key into a store column of max bytes. A key of at most max
// bytes, or any key when max <= 0, is returned unchanged; a longer key, or
// one that starts with HashedKeyPrefix, is replaced by HashedKeyPrefix and
// the lowercase hex SHA-256 of the whole key (78 bytes). It never truncates:
// two long keys sharing a prefix stay distinct.
//
// The result is always 78 bytes for a hashed key, so a max below 78 still
// returns 78 bytes; give stores at least 78.
func Limit(key string, max int) string {
	if max <= 0 || len(key) <= max && !strings.HasPrefix(key, HashedKeyPrefix) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var buf [hashedKeyLen]byte
	copy(buf[:], HashedKeyPrefix)
	hex.Encode(buf[len(HashedKeyPrefix):], sum[:])
	return string(buf[:])
}
