package keygen

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/ThreeDotsLabs/watermill/message"
)

// PayloadFingerprint is the lowercase hex SHA-256 of the payload bytes. The
// store compares it when a key is seen again: same key with another payload
// is a mismatch, not a duplicate. A nil message has no fingerprint ("").
func PayloadFingerprint(msg *message.Message) string {
	if msg == nil {
		return ""
	}
	sum := sha256.Sum256(msg.Payload)
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], sum[:])
	return string(buf[:])
}

// FingerprintOf is g's own fingerprint when g implements Fingerprinter and
// PayloadFingerprint otherwise. An empty result means "do not check".
func FingerprintOf(g Generator, msg *message.Message) string {
	if f, ok := g.(Fingerprinter); ok {
		return f.Fingerprint(msg)
	}
	return PayloadFingerprint(msg)
}
