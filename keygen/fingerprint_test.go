package keygen_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

func TestPayloadFingerprint(t *testing.T) {
	for _, p := range []string{"", `{"a":1}`, "\x00\xff"} {
		sum := sha256.Sum256([]byte(p))
		if got := keygen.PayloadFingerprint(msgWith(p)); got != hex.EncodeToString(sum[:]) {
			t.Errorf("PayloadFingerprint(%q) = %s", p, got)
		}
	}
	if got := keygen.PayloadFingerprint(nil); got != "" {
		t.Errorf("nil message: %q", got)
	}
}

func TestFingerprintOf(t *testing.T) {
	msg := msgWith(`{"a":1}`)
	tenant, _ := keygen.Metadata("tenant")
	tests := []struct {
		name string
		g    keygen.Generator
		want string
	}{
		{"UUID uses the payload", keygen.UUID(), keygen.PayloadFingerprint(msg)},
		{"Metadata uses the payload", tenant, keygen.PayloadFingerprint(msg)},
		{"Func uses the payload", constKey("k"), keygen.PayloadFingerprint(msg)},
		{"ContentHash has none", newContentHash(t, keygen.ContentHashOptions{}), ""},
		{"own fingerprint", fingerprinted{"mine"}, "mine"},
		{"nil generator uses the payload", nil, keygen.PayloadFingerprint(msg)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := keygen.FingerprintOf(tt.g, msg); got != tt.want {
				t.Errorf("FingerprintOf = %q, want %q", got, tt.want)
			}
		})
	}
}

// The scenario docs/keys.md warns about: a producer re-sends the same
// logical message with the same id but a new sent_at inside the payload.
func TestFingerprintResendWithNewTimestamp(t *testing.T) {
	first := message.NewMessage("id-1", []byte(`{"order":7,"meta":{"sent_at":"10:00"}}`))
	first.Metadata.Set("Idempotency-Key", "ord-7")
	again := message.NewMessage("id-1", []byte(`{"order":7,"meta":{"sent_at":"10:05"}}`))
	again.Metadata.Set("Idempotency-Key", "ord-7")

	header, _ := keygen.Metadata("Idempotency-Key")
	content := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"meta.sent_at"}})
	both := mustComposite(t, header, content)

	tests := []struct {
		name     string
		g        keygen.Generator
		mismatch bool
	}{
		{"UUID: same key, fingerprints differ", keygen.UUID(), true},
		{"Metadata: same key, fingerprints differ", header, true},
		{"ContentHash: same key, no fingerprint", content, false},
		{"Composite with ContentHash: same key, no fingerprint", both, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if mustKey(t, tt.g, first) != mustKey(t, tt.g, again) {
				t.Fatal("keys differ")
			}
			a, b := keygen.FingerprintOf(tt.g, first), keygen.FingerprintOf(tt.g, again)
			// The store reports a mismatch when both are non-empty and differ.
			if got := a != "" && b != "" && a != b; got != tt.mismatch {
				t.Errorf("mismatch = %v, want %v (fingerprints %q, %q)", got, tt.mismatch, a, b)
			}
		})
	}
}
