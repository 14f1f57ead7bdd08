package keygen_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
)

func newContentHash(t testing.TB, opts keygen.ContentHashOptions) keygen.Generator {
	t.Helper()
	g, err := keygen.ContentHash(opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// msgWith builds a message; md is name, value pairs.
func msgWith(payload string, md ...string) *message.Message {
	msg := message.NewMessage("uuid-1", []byte(payload))
	for i := 0; i+1 < len(md); i += 2 {
		msg.Metadata.Set(md[i], md[i+1])
	}
	return msg
}

func mustKey(t testing.TB, g keygen.Generator, msg *message.Message) string {
	t.Helper()
	k, err := g.Key(msg)
	if err != nil {
		t.Fatalf("Key(%q): %v", msg.Payload, err)
	}
	return k
}

func TestContentHashKeyFormat(t *testing.T) {
	t.Parallel()
	k := mustKey(t, newContentHash(t, keygen.ContentHashOptions{}), msgWith(`{"a":1}`))
	if len(k) != 71 || !strings.HasPrefix(k, "sha256:") {
		t.Fatalf("key %q: want sha256: and 64 hex digits", k)
	}
	if _, err := hex.DecodeString(k[7:]); err != nil || strings.ToLower(k) != k {
		t.Fatalf("key %q is not lowercase hex", k)
	}
}

// The key is SHA-256 over a domain byte, the metadata block and the body,
// exactly as docs/keys.md describes; this pins the construction.
func TestContentHashConstruction(t *testing.T) {
	t.Parallel()
	want := func(domain byte, meta [][2]string, body string) string {
		var b []byte
		b = append(b, domain)
		b = binary.BigEndian.AppendUint64(b, uint64(len(meta)))
		for _, kv := range meta {
			for _, s := range kv {
				b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
				b = append(b, s...)
			}
		}
		b = append(b, body...)
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	g := newContentHash(t, keygen.ContentHashOptions{})
	gm := newContentHash(t, keygen.ContentHashOptions{IncludeMetadata: []string{"tenant", "region"}})

	tests := []struct {
		name string
		g    keygen.Generator
		msg  *message.Message
		want string
	}{
		{"json", g, msgWith(` { "b" : 1.50 , "a" : [ true , null , "\u0041" ] } `), want('J', nil, `{"a":[true,null,"A"],"b":15e-1}`)},
		{"raw", g, msgWith(`not json`), want('R', nil, `not json`)},
		{"empty", g, msgWith(``), want('R', nil, ``)},
		{"metadata sorted by name", gm, msgWith(`1`, "tenant", "t1", "region", "eu"), want('J', [][2]string{{"region", "eu"}, {"tenant", "t1"}}, `1`)},
		{"missing metadata is empty", gm, msgWith(`1`, "tenant", "t1"), want('J', [][2]string{{"region", ""}, {"tenant", "t1"}}, `1`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := mustKey(t, tt.g, tt.msg); got != tt.want {
				t.Errorf("key = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestContentHashEqualJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"key order", `{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{"key order depth 2", `{"x":{"a":1,"b":2}}`, `{"x":{"b":2,"a":1}}`},
		{"key order depth 3", `{"x":{"y":{"a":1,"b":2,"c":[{"d":1,"e":2}]}},"z":0}`, `{"z":0,"x":{"y":{"c":[{"e":2,"d":1}],"b":2,"a":1}}}`},
		{"key order by bytes", `{"é":1,"z":2,"Z":3,"a":4}`, `{"Z":3,"a":4,"z":2,"é":1}`},
		{"whitespace", `{"a":[1,2],"b":{"c":null}}`, " \t\r\n{ \"a\" :\n[ 1 ,\t2 ] , \"b\":{\"c\" : null}\n}\n"},
		{"1 vs 1.0", `1`, `1.0`},
		{"1 vs 1.00", `1`, `1.00`},
		{"1 vs 1e0", `1`, `1e0`},
		{"1 vs 10e-1", `1`, `10e-1`},
		{"1 vs 0.1e1", `1`, `0.1e1`},
		{"1 vs 1E+0", `1`, `1E+0`},
		{"100 vs 1e2", `100`, `1e2`},
		{"100 vs 1.00e2", `100`, `1.00e2`},
		{"100 vs 0.001e5", `100`, `0.001e5`},
		{"-0 vs 0", `0`, `-0`},
		{"0 vs -0.0e5", `0`, `-0.0e5`},
		{"0.5 vs 5e-1", `0.5`, `5e-1`},
		{"-1.25 vs -125e-2", `-1.25`, `-125e-2`},
		{"big integer", `12345678901234567890123`, `1.2345678901234567890123e22`},
		{"huge exponent", `1e400`, `10e399`},
		{"exponent beyond int64", `1e99999999999999999999`, `0.1e100000000000000000000`},
		{"numbers in arrays", `[1,100,0]`, `[1.0,1e2,-0]`},
		{`"\u0041" vs "A"`, `"\u0041"`, `"A"`},
		{`"\/" vs "/"`, `"a\/b"`, `"a/b"`},
		{"hex escape case", `"\u00e9"`, `"\u00E9"`},
		{"escaped vs raw non-ASCII", `"\u00e9"`, `"é"`},
		{"surrogate pair vs raw", `"\ud83d\ude00"`, `"😀"`},
		{"short vs long escape", `"a\nb"`, `"a\u000ab"`},
		{"escaped quote", `"\""`, `"\u0022"`},
		{"escaped key", `{"\u0061":1}`, `{"a":1}`},
		{"escaped keys sort decoded", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"empty containers", `{"a":[],"b":{}}`, `{ "b" : { } , "a" : [ ] }`},
	}
	g := newContentHash(t, keygen.ContentHashOptions{RejectNonJSON: true})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := mustKey(t, g, msgWith(tt.a)), mustKey(t, g, msgWith(tt.b))
			if a != b {
				t.Errorf("%s and %s hash differently", tt.a, tt.b)
			}
		})
	}
}

func TestContentHashDifferentJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"1 vs 1.1", `1`, `1.1`},
		{"1e2 vs 1e3", `1e2`, `1e3`},
		{"10 vs 1", `10`, `1`},
		{"1 vs -1", `1`, `-1`},
		{"0.1 vs 1", `0.1`, `1`},
		{"precision beyond float64", `12345678901234567890123`, `12345678901234567890124`},
		{"tiny difference", `1`, `1.0000000000000000000000001`},
		{"exponents beyond int64", `1e99999999999999999999`, `1e99999999999999999998`},
		{"number vs string", `1`, `"1"`},
		{"null vs string", `null`, `"null"`},
		{"true vs false", `true`, `false`},
		{"object vs array", `{}`, `[]`},
		{"array order", `[1,2]`, `[2,1]`},
		{"nested array order", `{"a":[{"x":1},{"x":2}]}`, `{"a":[{"x":2},{"x":1}]}`},
		{"whitespace inside strings", `"a b"`, `"ab"`},
		{"value moves between keys", `{"a":1,"b":2}`, `{"a":2,"b":1}`},
		{"nesting vs dotted name", `{"a":{"b":1}}`, `{"a.b":1}`},
		{"array vs scalar", `[1]`, `1`},
		{"array split", `[[1,2]]`, `[[1],[2]]`},
		{"key vs value boundary", `{"ab":"c"}`, `{"a":"bc"}`},
		{"escape in string", `"a\\b"`, `"a\\\\b"`},
		{"case of strings", `"A"`, `"a"`},
		{"NUL vs empty", `"\u0000"`, `""`},
	}
	g := newContentHash(t, keygen.ContentHashOptions{RejectNonJSON: true})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := mustKey(t, g, msgWith(tt.a)), mustKey(t, g, msgWith(tt.b))
			if a == b {
				t.Errorf("%s and %s hash the same", tt.a, tt.b)
			}
		})
	}
}

func TestContentHashExclude(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		exclude []string
		a, b    string
		equal   bool
	}{
		{"name at depth 3", []string{"sent_at"},
			`{"a":{"b":{"sent_at":"10:00","x":1}}}`, `{"a":{"b":{"sent_at":"10:05","x":1}}}`, true},
		{"name at the root", []string{"sent_at"},
			`{"sent_at":1,"x":1}`, `{"sent_at":2,"x":1}`, true},
		{"excluded is as if absent", []string{"sent_at"},
			`{"sent_at":1,"x":1}`, `{"x":1}`, true},
		{"name removes a whole subtree", []string{"meta"},
			`{"meta":{"a":[1,2,{"b":3}]},"x":1}`, `{"x":1,"meta":null}`, true},
		{"name matches the decoded name", []string{"sent_at"},
			`{"sent\u005fat":1,"x":1}`, `{"x":1}`, true},
		{"name applies inside arrays of objects", []string{"sent_at"},
			`{"items":[{"sku":"a","sent_at":1},[{"sent_at":3}]]}`, `{"items":[{"sku":"a","sent_at":2},[{"sent_at":4}]]}`, true},
		{"other fields still count", []string{"sent_at"},
			`{"sent_at":1,"x":1}`, `{"sent_at":1,"x":2}`, false},
		{"without exclusion it counts", nil,
			`{"a":{"b":{"sent_at":"10:00","x":1}}}`, `{"a":{"b":{"sent_at":"10:05","x":1}}}`, false},
		{"path removes that path", []string{"meta.sent_at"},
			`{"meta":{"sent_at":1,"id":7},"sent_at":5}`, `{"meta":{"sent_at":2,"id":7},"sent_at":5}`, true},
		{"path keeps the same name at the root", []string{"meta.sent_at"},
			`{"meta":{"sent_at":1},"sent_at":5}`, `{"meta":{"sent_at":1},"sent_at":6}`, false},
		{"path keeps the same name deeper", []string{"meta.sent_at"},
			`{"meta":{"inner":{"sent_at":1}}}`, `{"meta":{"inner":{"sent_at":2}}}`, false},
		{"path keeps the same name elsewhere", []string{"meta.sent_at"},
			`{"other":{"sent_at":1}}`, `{"other":{"sent_at":2}}`, false},
		{"path does not enter arrays", []string{"items.sent_at"},
			`{"items":[{"sent_at":1}]}`, `{"items":[{"sent_at":2}]}`, false},
		{"path at depth 3", []string{"a.b.c"},
			`{"a":{"b":{"c":1,"d":1}}}`, `{"a":{"b":{"c":2,"d":1}}}`, true},
		{"path through a non-object", []string{"meta.sent_at"},
			`{"meta":"x"}`, `{"meta":"y"}`, false},
		{"shorter path wins", []string{"a.b", "a.b.c"},
			`{"a":{"b":{"c":1,"d":1}}}`, `{"a":{"b":{"c":2,"d":2}}}`, true},
		{"names and paths together", []string{"trace_id", "meta.sent_at"},
			`{"trace_id":"t1","meta":{"sent_at":1,"trace_id":"x"}}`, `{"meta":{"trace_id":"y","sent_at":2},"trace_id":"t2"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newContentHash(t, keygen.ContentHashOptions{Exclude: tt.exclude, RejectNonJSON: true})
			a, b := mustKey(t, g, msgWith(tt.a)), mustKey(t, g, msgWith(tt.b))
			if (a == b) != tt.equal {
				t.Errorf("Exclude %q: %s and %s: equal = %v, want %v", tt.exclude, tt.a, tt.b, a == b, tt.equal)
			}
		})
	}
}

// An excluded member is still part of the payload: it must be valid JSON,
// and it counts for duplicate keys.
func TestContentHashExcludedMembersAreStillChecked(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"sent_at", "meta.x"}, RejectNonJSON: true})
	for _, p := range []string{
		`{"sent_at":tru,"a":1}`,
		`{"sent_at":1,"sent_at":2}`,
		`{"sent_at":{"a":1,"a":2}}`,
		`{"meta":{"x":[1,}}`,
		`{"sent_at":"` + "\xff" + `"}`,
	} {
		if _, err := g.Key(msgWith(p)); !errors.Is(err, keygen.ErrNotJSON) {
			t.Errorf("%s: err = %v, want ErrNotJSON", p, err)
		}
	}
}

func TestContentHashIncludeMetadata(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{IncludeMetadata: []string{"tenant", "region"}})
	payload := `{"order":7}`
	base := mustKey(t, g, msgWith(payload, "tenant", "t1", "region", "eu", "trace", "a"))

	tests := []struct {
		name  string
		msg   *message.Message
		equal bool
	}{
		{"same", msgWith(payload, "tenant", "t1", "region", "eu", "trace", "a"), true},
		{"unlisted header differs", msgWith(payload, "tenant", "t1", "region", "eu", "trace", "b"), true},
		{"unlisted header missing", msgWith(payload, "tenant", "t1", "region", "eu"), true},
		{"included header differs", msgWith(payload, "tenant", "t2", "region", "eu", "trace", "a"), false},
		{"other included header differs", msgWith(payload, "tenant", "t1", "region", "us", "trace", "a"), false},
		{"included header missing", msgWith(payload, "region", "eu", "trace", "a"), false},
		{"payload differs", msgWith(`{"order":8}`, "tenant", "t1", "region", "eu", "trace", "a"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := mustKey(t, g, tt.msg); (got == base) != tt.equal {
				t.Errorf("equal = %v, want %v", got == base, tt.equal)
			}
		})
	}

	t.Run("missing and empty are the same", func(t *testing.T) {
		t.Parallel()
		if mustKey(t, g, msgWith(payload, "tenant", "t1")) != mustKey(t, g, msgWith(payload, "tenant", "t1", "region", "")) {
			t.Error("a missing field and an empty one hash differently")
		}
	})
	t.Run("order of names does not matter", func(t *testing.T) {
		t.Parallel()
		g2 := newContentHash(t, keygen.ContentHashOptions{IncludeMetadata: []string{"region", "tenant", "region"}})
		if mustKey(t, g2, msgWith(payload, "tenant", "t1", "region", "eu")) != base {
			t.Error("IncludeMetadata order changed the key")
		}
	})
	t.Run("values cannot shift between fields", func(t *testing.T) {
		t.Parallel()
		a := mustKey(t, g, msgWith(payload, "region", "eut1"))
		b := mustKey(t, g, msgWith(payload, "region", "eu", "tenant", "t1"))
		c := mustKey(t, g, msgWith(payload, "tenant", "eut1"))
		if a == b || b == c || a == c {
			t.Error("length prefixes do not separate metadata values")
		}
	})
	t.Run("applies to non-JSON payloads", func(t *testing.T) {
		t.Parallel()
		if mustKey(t, g, msgWith("raw", "tenant", "t1")) == mustKey(t, g, msgWith("raw", "tenant", "t2")) {
			t.Error("tenant ignored for a raw payload")
		}
	})
}

func TestContentHashNonJSON(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{})
	raw := []string{`hello`, `{"a":1`, `{"a":1}x`, "\"\xff\"", `{"a":1,"a":1}`, ``, ` `, `{'a':1}`}
	seen := map[string]string{}
	for _, p := range raw {
		k := mustKey(t, g, msgWith(p))
		if k2 := mustKey(t, g, msgWith(p)); k2 != k {
			t.Errorf("%q: key not deterministic", p)
		}
		if other, dup := seen[k]; dup {
			t.Errorf("%q and %q share a key", p, other)
		}
		seen[k] = p
	}
	// No raw key equals a JSON key, even for bytes that are close to JSON.
	for _, p := range []string{`"hello"`, `{"a":1}`, `1`, `{}`, `{"a":1}` + " "} {
		if other, dup := seen[mustKey(t, g, msgWith(p))]; dup {
			t.Errorf("JSON %q has the key of raw %q", p, other)
		}
	}
	// Raw keys hash the bytes as they are.
	if mustKey(t, g, msgWith(`{"a":1`)) == mustKey(t, g, msgWith(`{ "a":1`)) {
		t.Error("raw payloads differing in whitespace hash the same")
	}
}

func TestContentHashRejectNonJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload string
		wantMsg string
	}{
		{"malformed", `{"a":}`, `at offset 5: invalid character '}' looking for beginning of value`},
		{"trailing garbage", `{"a":1}x`, `at offset 7: invalid character 'x' after top-level value`},
		{"two values", `{"a":1} {"b":2}`, `at offset 8: invalid character '{' after top-level value`},
		{"invalid UTF-8", "\"\xff\"", `at offset 1: invalid UTF-8 in string`},
		{"invalid UTF-8 in a key", "{\"a\xc3\":1}", `at offset 3: invalid UTF-8 in string`},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", `at offset 1: invalid UTF-8 in string`},
		{"byte order mark", "\xef\xbb\xbf{}", `at offset 0: invalid character byte 0xef looking for beginning of value`},
		{"empty", ``, `at offset 0: empty payload`},
		{"whitespace only", " \n", `at offset 0: only whitespace`},
		{"truncated", `{"a":[1,2`, `at offset 9: unexpected end of payload`},
		{"truncated string", `"abc`, `at offset 4: unexpected end of payload`},
		{"duplicate key", `{"id":1,"x":{"k":1,"k":2}}`, `at offset 19: duplicate object key "k"`},
		{"duplicate key spelled differently", `{"a":1,"\u0061":2}`, `duplicate object key "a"`},
		{"unpaired high surrogate", `"\ud800"`, `at offset 1: unpaired UTF-16 surrogate`},
		{"unpaired low surrogate", `"\udc00x"`, `at offset 1: unpaired UTF-16 surrogate`},
		{"high surrogate then non-surrogate", `"\ud800\u0041"`, `unpaired UTF-16 surrogate`},
		{"bad escape", `"\x"`, `at offset 2: invalid character 'x' in string escape code`},
		{"bad hex", `"\u12g4"`, `at offset 5: invalid character 'g' in \u hexadecimal character escape`},
		{"control character", "\"a\tb\"", `at offset 2: invalid character '\t' in string literal`},
		{"single quotes", `{'a':1}`, `at offset 1: invalid character '\'' looking for beginning of object key string`},
		{"leading zero", `01`, `at offset 1: invalid character '1' after top-level value`},
		{"plus sign", `+1`, `at offset 0: invalid character '+' looking for beginning of value`},
		{"dot without digits", `1.`, `at offset 2: unexpected end of payload`},
		{"leading dot", `.5`, `invalid character '.' looking for beginning of value`},
		{"empty exponent", `1e+`, `at offset 3: unexpected end of payload`},
		{"NaN", `NaN`, `invalid character 'N' looking for beginning of value`},
		{"bad literal", `[tru]`, `at offset 4: invalid character ']' in literal true`},
		{"missing colon", `{"a" 1}`, `at offset 5: invalid character '1' after object key`},
		{"trailing comma in object", `{"a":1,}`, `at offset 7: invalid character '}' looking for beginning of object key string`},
		{"trailing comma in array", `[1,]`, `at offset 3: invalid character ']' looking for beginning of value`},
		{"missing comma", `[1 2]`, `at offset 3: invalid character '2' after array element`},
		{"too deep", strings.Repeat("[", 1001) + strings.Repeat("]", 1001), `at offset 1000: objects and arrays nest deeper than 1000 levels`},
	}
	g := newContentHash(t, keygen.ContentHashOptions{RejectNonJSON: true, Exclude: []string{"sent_at"}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := g.Key(msgWith(tt.payload))
			if !errors.Is(err, keygen.ErrNotJSON) || !errors.Is(err, keygen.ErrNoKey) {
				t.Fatalf("Key = %q, %v; want ErrNotJSON and ErrNoKey", k, err)
			}
			if k != "" {
				t.Errorf("key %q with an error", k)
			}
			if !strings.HasPrefix(err.Error(), "oncemill: no key: payload is not valid JSON ") || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestContentHashDepth(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{RejectNonJSON: true})
	nest := func(n int, open, close string) string {
		return strings.Repeat(open, n) + "1" + strings.Repeat(close, n)
	}
	tests := []struct {
		name    string
		payload string
		ok      bool
	}{
		{"1000 arrays", nest(1000, "[", "]"), true},
		{"1000 objects", nest(1000, `{"a":`, "}"), true},
		{"1001 arrays", nest(1001, "[", "]"), false},
		{"1001 mixed", nest(500, `{"a":[`, "]}") + "", true},
		{"1002 mixed", nest(501, `{"a":[`, "]}"), false},
		{"100k unclosed arrays", strings.Repeat("[", 100_000), false},
		{"100k unclosed objects", strings.Repeat(`{"a":`, 100_000), false},
		{"100k closed arrays", nest(100_000, "[", "]"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := g.Key(msgWith(tt.payload))
			if tt.ok && err != nil {
				t.Fatalf("err = %v", err)
			}
			if !tt.ok && (!errors.Is(err, keygen.ErrNotJSON) || !strings.Contains(err.Error(), "deeper than 1000")) {
				t.Fatalf("err = %v, want the depth error", err)
			}
		})
	}
	// Without RejectNonJSON, too deep is keyed by its raw bytes.
	raw := newContentHash(t, keygen.ContentHashOptions{})
	if _, err := raw.Key(msgWith(strings.Repeat("[", 100_000))); err != nil {
		t.Fatalf("raw: %v", err)
	}
}

// largeJSON is realistic JSON of about size bytes: an array of orders.
// With shuffled, it is the same JSON written differently: members in another
// order, spaces and newlines, escapes and other number spellings (and other
// sent_at values, for a generator to exclude).
func largeJSON(size int, shuffled bool) []byte {
	const orderLen = 190 // bytes per order, unshuffled
	var b bytes.Buffer
	b.WriteString(`{"batch":"b-1","orders":[`)
	for i := range size / orderLen {
		if i > 0 {
			b.WriteByte(',')
		}
		if shuffled {
			fmt.Fprintf(&b, "\n  {\"meta\": {\"sent_at\": \"2026-01-0%dT10:00:00Z\", \"source\": \"web\"}, \"lines\": [{\"qty\": 2.0, \"sku\": \"SKU-%d\"}, {\"qty\": 1e0, \"sku\": \"SKU-%d\"}], \"amount\": {\"value\": %d.50, \"currency\": \"EUR\"}, \"customer\": \"c\\u002d%d\", \"id\": %d}", i%9+1, i, i+1, i, i%1000, i)
		} else {
			fmt.Fprintf(&b, `{"id":%d,"customer":"c-%d","amount":{"currency":"EUR","value":%d.5},"lines":[{"sku":"SKU-%d","qty":2},{"sku":"SKU-%d","qty":1}],"meta":{"source":"web","sent_at":"2026-01-01T10:00:00Z"}}`, i, i%1000, i, i, i+1)
		}
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func TestContentHashLargePayload(t *testing.T) {
	if testing.Short() {
		t.Skip("10 MB payload")
	}
	g := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"sent_at"}, RejectNonJSON: true})
	a, b := largeJSON(10<<20, false), largeJSON(10<<20, true)
	start := time.Now()
	ka := mustKey(t, g, message.NewMessage("1", a))
	elapsed := time.Since(start)
	t.Logf("%d bytes in %v", len(a), elapsed)
	// About 0.1 s here; the bound only catches something quadratic.
	if !raceEnabled && elapsed > 5*time.Second {
		t.Errorf("10 MB took %v", elapsed)
	}
	kb := mustKey(t, g, message.NewMessage("2", b))
	if ka != kb {
		t.Error("the same 10 MB document written two ways hashes differently")
	}
	c := bytes.Replace(a, []byte(`"SKU-4242"`), []byte(`"SKU-4243"`), 1)
	if bytes.Equal(a, c) {
		t.Fatal("test payload too small")
	}
	if mustKey(t, g, message.NewMessage("3", c)) == ka {
		t.Error("a one-byte change in a 10 MB document did not change the key")
	}
}

func TestContentHashEmptyPayload(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{})
	// Empty is not JSON: every empty payload is the same raw content.
	if a, b := mustKey(t, g, msgWith("")), mustKey(t, g, message.NewMessage("other", nil)); a != b {
		t.Error("empty payloads hash differently")
	}
	if mustKey(t, g, msgWith("")) == mustKey(t, g, msgWith(`""`)) {
		t.Error("empty payload hashes like the JSON empty string")
	}
	reject := newContentHash(t, keygen.ContentHashOptions{RejectNonJSON: true})
	if _, err := reject.Key(msgWith("")); !errors.Is(err, keygen.ErrNotJSON) {
		t.Errorf("RejectNonJSON, empty payload: err = %v, want ErrNotJSON", err)
	}
}

func TestContentHashFingerprintIsEmpty(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{})
	f, ok := g.(keygen.Fingerprinter)
	if !ok {
		t.Fatal("ContentHash does not implement Fingerprinter")
	}
	for _, p := range []string{`{"a":1}`, `raw`, ``} {
		if fp := f.Fingerprint(msgWith(p)); fp != "" {
			t.Errorf("Fingerprint(%q) = %q, want \"\"", p, fp)
		}
		if fp := fingerprintOf(g, msgWith(p)); fp != "" {
			t.Errorf("fingerprint of %q = %q, want \"\"", p, fp)
		}
	}
}

func TestContentHashInvalidOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts keygen.ContentHashOptions
		want string
	}{
		{"empty exclude", keygen.ContentHashOptions{Exclude: []string{"a", ""}}, "ContentHashOptions.Exclude: an empty entry"},
		{"empty middle segment", keygen.ContentHashOptions{Exclude: []string{"a..b"}}, `"a..b" has an empty segment`},
		{"leading dot", keygen.ContentHashOptions{Exclude: []string{".a"}}, `".a" has an empty segment`},
		{"trailing dot", keygen.ContentHashOptions{Exclude: []string{"a."}}, `"a." has an empty segment`},
		{"only a dot", keygen.ContentHashOptions{Exclude: []string{"."}}, `"." has an empty segment`},
		{"empty metadata name", keygen.ContentHashOptions{IncludeMetadata: []string{""}}, "ContentHashOptions.IncludeMetadata: an empty name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := keygen.ContentHash(tt.opts)
			if !errors.Is(err, oncemill.ErrInvalidConfig) || g != nil {
				t.Fatalf("ContentHash = %v, %v; want ErrInvalidOptions", g, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestContentHashNilMessage(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{})
	if _, err := g.Key(nil); !errors.Is(err, keygen.ErrNoKey) {
		t.Errorf("err = %v, want ErrNoKey", err)
	}
}

// Generators are shared by all handler goroutines; run with -race.
func TestContentHashConcurrent(t *testing.T) {
	t.Parallel()
	g := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"sent_at"}, IncludeMetadata: []string{"tenant"}})
	payloads := []string{`{"b":1,"a":[1,2,{"sent_at":3}]}`, `raw`, `{"x":"\u0041"}`, strings.Repeat("[", 50) + strings.Repeat("]", 50)}
	want := make([]string, len(payloads))
	for i, p := range payloads {
		want[i] = mustKey(t, g, msgWith(p, "tenant", "t"))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := (w + n) % len(payloads)
				if k, err := g.Key(msgWith(payloads[i], "tenant", "t")); err != nil || k != want[i] {
					t.Errorf("concurrent Key(%q) = %q, %v; want %q", payloads[i], k, err, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestContentHashAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under -race")
	}
	g := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"meta.sent_at"}})
	msg := msgWith(paymentJSON)
	mustKey(t, g, msg)
	if allocs := testing.AllocsPerRun(200, func() { _, _ = g.Key(msg) }); allocs > 1 {
		t.Errorf("%v allocations per Key, want at most 1 (the key string)", allocs)
	}
}
