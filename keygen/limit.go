package keygen

import (
	"crypto/sha256"
	"encoding/hex"
)

// hashedKeyLen is the length of "sha256:" followed by 64 hex digits.
const hashedKeyLen = len("sha256:") + 2*sha256.Size

// Limit fits a key into a store column of max bytes. A key of at most max
// bytes, or any key when max <= 0, is returned unchanged; a longer key is
// replaced by "sha256:" and the lowercase hex SHA-256 of the whole key (71
// bytes). It never truncates: two long keys sharing a prefix stay distinct.
//
// The result is always 71 bytes for a hashed key, so a max below 71 still
// returns 71 bytes; give stores at least 71.
func Limit(key string, max int) string {
	if max <= 0 || len(key) <= max {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	var buf [hashedKeyLen]byte
	copy(buf[:], "sha256:")
	hex.Encode(buf[len("sha256:"):], sum[:])
	return string(buf[:])
}
