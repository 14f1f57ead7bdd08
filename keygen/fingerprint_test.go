package keygen_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

func TestPayloadFingerprint(t *testing.T) {
	t.Parallel()
	// Published XXH64 test vectors (seed 0), so the fingerprint stays the
	// same across versions and processes sharing a store.
	for p, want := range map[string]string{
		"":    "ef46db3751d8e999",
		"abc": "44bc2cf5ad770999",
	} {
		if got := keygen.PayloadFingerprint(msgWith(p)); got != want {
			t.Errorf("PayloadFingerprint(%q) = %s, want %s", p, got, want)
		}
	}
	seen := map[string]string{}
	for _, p := range []string{`{"a":1}`, `{"a":2}`, "\x00\xff", "\x00"} {
		got := keygen.PayloadFingerprint(msgWith(p))
		if len(got) != 16 {
			t.Errorf("PayloadFingerprint(%q) = %q, want 16 hex digits", p, got)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%q and %q share fingerprint %s", p, other, got)
		}
		seen[got] = p
	}
	if got := keygen.PayloadFingerprint(nil); got != "" {
		t.Errorf("nil message: %q", got)
	}
}

func TestFingerprintChoice(t *testing.T) {
	t.Parallel()
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
			t.Parallel()
			if got := fingerprintOf(tt.g, msg); got != tt.want {
				t.Errorf("fingerprint = %q, want %q", got, tt.want)
			}
		})
	}
}

// The scenario docs/keys.md warns about: a producer re-sends the same
// logical message with the same id but a new sent_at inside the payload.
func TestFingerprintResendWithNewTimestamp(t *testing.T) {
	t.Parallel()
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
			t.Parallel()
			if mustKey(t, tt.g, first) != mustKey(t, tt.g, again) {
				t.Fatal("keys differ")
			}
			a, b := fingerprintOf(tt.g, first), fingerprintOf(tt.g, again)
			// The store reports a mismatch when both are non-empty and differ.
			if got := a != "" && b != "" && a != b; got != tt.mismatch {
				t.Errorf("mismatch = %v, want %v (fingerprints %q, %q)", got, tt.mismatch, a, b)
			}
		})
	}
}

// fingerprintOf is the fingerprint the receiver uses for g's messages: g's
// own when g is a keygen.Fingerprinter, else keygen.PayloadFingerprint.
func fingerprintOf(g keygen.Generator, msg *message.Message) string {
	if f, ok := g.(keygen.Fingerprinter); ok {
		return f.Fingerprint(msg)
	}
	return keygen.PayloadFingerprint(msg)
}
