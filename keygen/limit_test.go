package keygen_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/keygen"
)

func TestLimit(t *testing.T) {
	long := strings.Repeat("k", 10<<10)
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:])
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
		{"max below 71 still hashes", strings.Repeat("a", 20), 10, hashed(strings.Repeat("a", 20))},
		{"empty", "", 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := keygen.Limit(tt.key, tt.max)
			if got != tt.want {
				t.Fatalf("Limit = %.80q, want %.80q", got, tt.want)
			}
			if got != tt.key && len(got) != 71 {
				t.Errorf("hashed key is %d bytes, want 71", len(got))
			}
		})
	}
}

func TestLimitNeverTruncates(t *testing.T) {
	a := strings.Repeat("x", 10<<10) + "a"
	b := strings.Repeat("x", 10<<10) + "b"
	ka, kb := keygen.Limit(a, 255), keygen.Limit(b, 255)
	if ka == kb {
		t.Fatal("keys differing only in their last byte collide")
	}
	if ka != keygen.Limit(a, 255) {
		t.Error("not deterministic")
	}
	if strings.ContainsRune(ka[len("sha256:"):], 'x') {
		t.Errorf("%q holds a piece of the key", ka)
	}
	if !strings.HasPrefix(ka, "sha256:") {
		t.Errorf("%q lacks the sha256: prefix", ka)
	}
}
