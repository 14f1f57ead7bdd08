package keygen_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/keygen"
)

func TestStorableKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 10<<10)
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "hashed:sha256:" + hex.EncodeToString(sum[:])
	}
	tests := []struct {
		name string
		key  string
		max  int
		want string
	}{
		{"short", "order-42", 255, "order-42"},
		{"exactly max", strings.Repeat("a", 255), 255, strings.Repeat("a", 255)},
		{"one over", strings.Repeat("a", 256), 255, hashed(strings.Repeat("a", 256))},
		{"10 KB", long, 255, hashed(long)},
		{"no limit", long, 0, long},
		{"negative is no limit", long, -1, long},
		{"max below 78 still hashes", strings.Repeat("a", 20), 10, hashed(strings.Repeat("a", 20))},
		{"a short key in the hashed form is hashed", "hashed:sha256:" + "abc", 255, hashed("hashed:sha256:" + "abc")},
		{"a content hash key is kept", "sha256:" + strings.Repeat("0", 64), 255, "sha256:" + strings.Repeat("0", 64)},
		{"a NUL byte is hashed", "order\x0042", 255, hashed("order\x0042")},
		{"invalid UTF-8 is hashed", "order-\xff", 255, hashed("order-\xff")},
		{"unstorable bytes are hashed without a limit too", "order\x0042", 0, hashed("order\x0042")},
		{"empty", "", 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := keygen.StorableKey(tt.key, tt.max)
			if got != tt.want {
				t.Fatalf("Limit = %.80q, want %.80q", got, tt.want)
			}
			if got != tt.key && len(got) != 78 {
				t.Errorf("hashed key is %d bytes, want 78", len(got))
			}
		})
	}
}

func TestLimitNeverTruncates(t *testing.T) {
	t.Parallel()
	a := strings.Repeat("x", 10<<10) + "a"
	b := strings.Repeat("x", 10<<10) + "b"
	ka, kb := keygen.StorableKey(a, 255), keygen.StorableKey(b, 255)
	if ka == kb {
		t.Fatal("keys differing only in their last byte collide")
	}
	if ka != keygen.StorableKey(a, 255) {
		t.Error("not deterministic")
	}
	if strings.ContainsRune(ka[len("hashed:sha256:"):], 'x') {
		t.Errorf("%q holds a piece of the key", ka)
	}
	if !strings.HasPrefix(ka, "hashed:sha256:") {
		t.Errorf("%q lacks the prefix %s", ka, "hashed:sha256:")
	}
}

// A message whose key is literally the hashed form of another message's
// long key is not its duplicate.
func TestHashedKeysNeverEqualLiteralOnes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("line-item;", 60)
	hashed := keygen.StorableKey(long, 512)
	if hashed == long {
		t.Fatal("a 600-byte key was not hashed at max 512")
	}
	if literal := keygen.StorableKey(hashed, 512); literal == hashed {
		t.Fatalf("the literal key %q fits unchanged and equals the long key's hash", hashed)
	}
}
