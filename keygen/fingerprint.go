package keygen

import (
	"encoding/binary"
	"encoding/hex"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cespare/xxhash/v2"
)

// PayloadFingerprint is the payload's 64-bit xxHash (XXH64, seed 0) in
// lowercase hex, 16 digits. The store compares it when a key is seen again:
// same key with another payload is a mismatch, not a duplicate. A nil
// message has no fingerprint ("").
//
// The fingerprint catches a key reused by mistake; it is not a security
// boundary, so it uses a fast stable hash rather than SHA-256 (it runs for
// every message). A crafted collision gains nothing: whoever can publish
// under a key can already claim it first.
func PayloadFingerprint(msg *message.Message) string {
	if msg == nil {
		return ""
	}
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], xxhash.Sum64(msg.Payload))
	var buf [16]byte
	hex.Encode(buf[:], sum[:])
	return string(buf[:])
}

// NoFingerprint turns mismatch detection off (receiver.WithFingerprint): a
// key seen again with another payload is a duplicate, not a mismatch.
func NoFingerprint(*message.Message) string { return "" }
