package keygen_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
)

func constKey(k string) keygen.Generator {
	return keygen.Func(func(*message.Message) (string, error) { return k, nil })
}

// fingerprinted is a generator with its own fingerprint.
type fingerprinted struct{ fp string }

func (f fingerprinted) Key(*message.Message) (string, error) { return "k", nil }
func (f fingerprinted) Fingerprint(*message.Message) string  { return f.fp }

func mustComposite(t *testing.T, parts ...keygen.Generator) keygen.Generator {
	t.Helper()
	g, err := keygen.Composite(parts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestCompositeKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		parts []string
		want  string
	}{
		{[]string{"a:b", "c"}, "3:a:b|1:c"},
		{[]string{"a", "b:c"}, "1:a|3:b:c"},
		{[]string{"one"}, "3:one"},
		{[]string{"a|1:b", "c"}, "5:a|1:b|1:c"},
		{[]string{"a", "1:b|1:c"}, "1:a|7:1:b|1:c"},
		{[]string{"é", strings.Repeat("x", 12)}, "2:é|12:" + strings.Repeat("x", 12)},
	}
	for _, tt := range tests {
		var parts []keygen.Generator
		for _, p := range tt.parts {
			parts = append(parts, constKey(p))
		}
		if got := mustKey(t, mustComposite(t, parts...), msgWith("")); got != tt.want {
			t.Errorf("Composite%q = %q, want %q", tt.parts, got, tt.want)
		}
	}
}

func TestCompositeIsUnambiguous(t *testing.T) {
	t.Parallel()
	tuples := [][]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b", "c"}, {"ab", "c"}, {"a", "bc"}, {"abc"},
		{"1:a", "b"}, {"1", "a|1:b"}, {"a|1:b"}, {"a", "1:b"}, {"3:a:b|1:c"}, {"|", "|"}, {"||"},
	}
	seen := map[string][]string{}
	for _, tuple := range tuples {
		var parts []keygen.Generator
		for _, p := range tuple {
			parts = append(parts, constKey(p))
		}
		k := mustKey(t, mustComposite(t, parts...), msgWith(""))
		if other, dup := seen[k]; dup {
			t.Errorf("%q and %q both give %q", tuple, other, k)
		}
		seen[k] = tuple
	}
}

func TestCompositeErrors(t *testing.T) {
	t.Parallel()
	failing := keygen.Func(func(*message.Message) (string, error) { return "", errors.New("boom") })

	t.Run("part error is wrapped with its index", func(t *testing.T) {
		t.Parallel()
		g := mustComposite(t, constKey("a"), keygen.UUID())
		_, err := g.Key(message.NewMessage("", nil))
		if !errors.Is(err, keygen.ErrEmptyKey) || !errors.Is(err, keygen.ErrNoKey) {
			t.Fatalf("err = %v, want ErrEmptyKey", err)
		}
		if !strings.Contains(err.Error(), "composite part 1:") {
			t.Errorf("error %q does not name part 1", err)
		}
	})
	t.Run("custom error", func(t *testing.T) {
		t.Parallel()
		_, err := mustComposite(t, failing).Key(msgWith(""))
		if err == nil || err.Error() != "composite part 0: boom" {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("empty part key", func(t *testing.T) {
		t.Parallel()
		_, err := mustComposite(t, constKey("a"), constKey("")).Key(msgWith(""))
		if !errors.Is(err, keygen.ErrEmptyKey) || !errors.Is(err, keygen.ErrNoKey) {
			t.Fatalf("err = %v, want ErrEmptyKey", err)
		}
	})
	t.Run("no parts", func(t *testing.T) {
		t.Parallel()
		if g, err := keygen.Composite(); !errors.Is(err, oncemill.ErrInvalidConfig) || g != nil {
			t.Fatalf("Composite() = %v, %v", g, err)
		}
	})
	t.Run("nil part", func(t *testing.T) {
		t.Parallel()
		g, err := keygen.Composite(keygen.UUID(), nil)
		if !errors.Is(err, oncemill.ErrInvalidConfig) || g != nil || !strings.Contains(err.Error(), "part 1 is nil") {
			t.Fatalf("Composite(UUID, nil) = %v, %v", g, err)
		}
	})
	t.Run("caller's slice is copied", func(t *testing.T) {
		t.Parallel()
		parts := []keygen.Generator{constKey("a")}
		g := mustComposite(t, parts...)
		parts[0] = constKey("b")
		if k := mustKey(t, g, msgWith("")); k != "1:a" {
			t.Errorf("key = %q after the caller changed its slice", k)
		}
	})
}

func TestCompositeFingerprint(t *testing.T) {
	t.Parallel()
	content := newContentHash(t, keygen.ContentHashOptions{})
	tenant, _ := keygen.Metadata("tenant")
	msg := msgWith(`{"a":1}`, "tenant", "t1")

	tests := []struct {
		name  string
		parts []keygen.Generator
		want  string
	}{
		{"no fingerprinting part: payload", []keygen.Generator{tenant, keygen.UUID()}, keygen.PayloadFingerprint(msg)},
		{"with ContentHash: none", []keygen.Generator{tenant, content}, ""},
		{"only empty fingerprints: none", []keygen.Generator{fingerprinted{""}, content}, ""},
		{"one fingerprinter", []keygen.Generator{tenant, fingerprinted{"abc"}}, "3:abc"},
		{"joined without ambiguity", []keygen.Generator{fingerprinted{"ab"}, fingerprinted{"c"}}, "2:ab|1:c"},
		{"empty and non-empty", []keygen.Generator{content, fingerprinted{"x"}}, "0:|1:x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := mustComposite(t, tt.parts...)
			if got := fingerprintOf(g, msg); got != tt.want {
				t.Errorf("fingerprint = %q, want %q", got, tt.want)
			}
		})
	}
}
