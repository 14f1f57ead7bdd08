package keygen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// FuzzContentHash checks that Key never panics, that the parser accepts
// exactly the JSON encoding/json accepts (less what it refuses on purpose:
// duplicate keys, depth over 1000, unpaired surrogates), and that equal JSON
// gives equal keys however it is written.
func FuzzContentHash(f *testing.F) {
	for _, seed := range []string{
		``, ` `, `null`, `true`, `false`, `0`, `-0`, `1.0`, `1e2`, `100`, `-1.5E+3`, `0.1e1`,
		`12345678901234567890123`, `1e99999999999999999999`, `"A"`, `"\u0041\/\n\u0000"`,
		`"\ud83d\ude00"`, `"\ud800"`, `"é"`, "\"\xff\"", `{"b":1,"a":[1,2,{"d":null,"c":true}]}`,
		`{"a":1,"a":2}`, `{"meta":{"sent_at":"x","id":1},"sent_at":2}`, `[1,]`, `{"a":}`,
		`{"a":1}x`, `[[[[[[]]]]]]`, `{"<&>":"\u2028"}`, `{"b":{"c":1,"d":[{"c":2}]}}`,
		` { "z" : [ 1 , 2.50 , "x" ] , "y" : { } } `,
	} {
		f.Add([]byte(seed))
	}
	plain := mustGenerator(f)(ContentHash(ContentHashOptions{}))
	reject := mustGenerator(f)(ContentHash(ContentHashOptions{RejectNonJSON: true}))
	excluding := mustGenerator(f)(ContentHash(ContentHashOptions{Exclude: []string{"a", "b.c"}, RejectNonJSON: true}))

	f.Fuzz(func(t *testing.T, data []byte) {
		key := func(g Generator, b []byte) (string, error) { return g.Key(message.NewMessage("u", b)) }

		k, err := key(plain, data)
		if err != nil || len(k) != contentKeyLen || !strings.HasPrefix(k, "sha256:") {
			t.Fatalf("without RejectNonJSON: Key = %q, %v", k, err)
		}
		kr, errReject := key(reject, data)
		if _, errExcl := key(excluding, data); (errExcl == nil) != (errReject == nil) {
			t.Fatalf("exclusions changed whether the payload is JSON: %v vs %v", errExcl, errReject)
		}

		var p parser
		accepted := p.parse(data, &exclusions{})
		if accepted != (errReject == nil) {
			t.Fatalf("parse = %v, but RejectNonJSON gave %v", accepted, errReject)
		}
		if !accepted {
			if !errors.Is(errReject, ErrNotJSON) || !errors.Is(errReject, ErrNoKey) {
				t.Fatalf("error %v does not wrap ErrNotJSON and ErrNoKey", errReject)
			}
		} else if kr != k {
			t.Fatalf("RejectNonJSON changed the key of JSON")
		}

		stdValid := json.Valid(data) && utf8.Valid(data)
		if accepted && !stdValid {
			t.Fatalf("accepted what encoding/json rejects: %q", data)
		}
		if !accepted {
			if refusedOnPurpose := p.err.kind == errDuplicate || p.err.kind == errDepth || p.err.kind == errSurrogate; stdValid && !refusedOnPurpose {
				t.Fatalf("rejected valid JSON %q: %v", data, errReject)
			}
			return
		}

		same := func(what string, other []byte) {
			t.Helper()
			ko, err := key(reject, other)
			if err != nil {
				t.Fatalf("%s %q: %v", what, other, err)
			}
			if ko != k {
				t.Fatalf("%s changed the key:\n%q\n%q", what, data, other)
			}
		}

		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot decode accepted %q: %v", data, err)
		}
		remarshaled, err := json.Marshal(v) // sorted keys, HTML escapes, no spaces
		if err != nil {
			t.Fatal(err)
		}
		same("json.Marshal", remarshaled)

		var buf bytes.Buffer
		if err := json.Indent(&buf, data, "", "  "); err != nil {
			t.Fatal(err)
		}
		same("json.Indent", buf.Bytes())
		buf.Reset()
		if err := json.Compact(&buf, data); err != nil {
			t.Fatal(err)
		}
		same("json.Compact", buf.Bytes())
		buf.Reset()
		if err := json.Indent(&buf, remarshaled, "\r\n", "\t"); err != nil {
			t.Fatal(err)
		}
		same("json.Indent of json.Marshal", buf.Bytes())

		for form := range 2 {
			respelled, err := json.Marshal(respellNumbers(t, v, form))
			if err != nil {
				t.Fatal(err)
			}
			same(fmt.Sprintf("numbers in spelling %d", form), respelled)
		}

		// Different JSON, different key.
		if kw, _ := key(reject, append(append([]byte("["), data...), ']')); kw == k {
			t.Fatal("[x] hashes like x")
		}

		// An excluded member is as if absent.
		if obj, ok := v.(map[string]any); ok {
			if _, has := obj["a"]; !has {
				ke, err := key(excluding, data)
				if err != nil {
					t.Fatal(err)
				}
				open := bytes.IndexByte(data, '{')
				sep := ""
				if len(obj) > 0 {
					sep = ","
				}
				with := fmt.Appendf(nil, `%s"a":[1,{"b":{"c":2}}]%s%s`, data[:open+1], sep, data[open+1:])
				if kw, err := key(excluding, with); err != nil || kw != ke {
					t.Fatalf("adding an excluded member changed the key: %q: %v", with, err)
				}
			}
		}
	})
}

func mustGenerator(f *testing.F) func(Generator, error) Generator {
	return func(g Generator, err error) Generator {
		if err != nil {
			f.Fatal(err)
		}
		return g
	}
}

// respellNumbers writes every number of v with the same value in another
// spelling: form 0 as integer digits with two extra zeros and an exponent
// (1.5 -> 1500e-3), form 1 as 0.digits and an exponent (1.5 -> 0.15E+1).
func respellNumbers(t *testing.T, v any, form int) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = respellNumbers(t, e, form)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = respellNumbers(t, e, form)
		}
		return out
	case json.Number:
		return respell(t, string(v), form)
	default:
		return v
	}
}

func respell(t *testing.T, n string, form int) json.Number {
	sign, abs := "", n
	if strings.HasPrefix(n, "-") {
		sign, abs = "-", n[1:]
	}
	mant, exp := abs, int64(0)
	if i := strings.IndexAny(abs, "eE"); i >= 0 {
		e, err := strconv.ParseInt(abs[i+1:], 10, 64)
		if err != nil || e > 1e15 || e < -1e15 {
			return json.Number(n) // leave absurd exponents alone
		}
		mant, exp = abs[:i], e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		digits = "0"
	}
	exp -= int64(len(frac))
	var out string
	switch {
	case digits == "0" && form == 0:
		out = sign + "0.000e7"
	case digits == "0":
		out = sign + "0E-3"
	case form == 0:
		out = fmt.Sprintf("%s%s00e%d", sign, digits, exp-2)
	default:
		out = fmt.Sprintf("%s0.%sE%+d", sign, digits, exp+int64(len(digits)))
	}
	// The respelling must keep the value; check it where math/big can.
	if exp > -1000 && exp < 1000 {
		a, okA := new(big.Rat).SetString(n)
		b, okB := new(big.Rat).SetString(out)
		if !okA || !okB || a.Cmp(b) != 0 {
			t.Fatalf("respell(%s) = %s changes the value", n, out)
		}
	}
	return json.Number(out)
}
