package keygen

import (
	"math/big"
	"testing"
)

func TestCanonicalNumber(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"0.000", "0"},
		{"-0.0e-5", "0"},
		{"0e99999999999999999999999", "0"},
		{"1", "1"},
		{"1.0", "1"},
		{"1.00", "1"},
		{"1e0", "1"},
		{"1E+0", "1"},
		{"1e-0", "1"},
		{"10e-1", "1"},
		{"0.1e1", "1"},
		{"100", "1e2"},
		{"1e2", "1e2"},
		{"1E+00002", "1e2"},
		{"0.001e5", "1e2"},
		{"10", "1e1"},
		{"1.5", "15e-1"},
		{"-1.5E+3", "-15e2"},
		{"0.00150e-3", "15e-7"},
		{"123.456e-7", "123456e-10"},
		{"1200.0034", "12000034e-4"},
		{"-120", "-12e1"},
		{"12345678901234567890123", "12345678901234567890123"},
		{"1.2345678901234567890123e22", "12345678901234567890123"},
		{"999999999999999999", "999999999999999999"},
		// Exponents at and beyond the int64 fast path.
		{"1e999999999999999999", "1e999999999999999999"},
		{"100e999999999999999999", "1e1000000000000000001"},
		{"1e99999999999999999999", "1e99999999999999999999"},
		{"10e99999999999999999999", "1e100000000000000000000"},
		{"0.1e-99999999999999999999", "1e-100000000000000000000"},
		{"-0.5e-0000000000000000000000001", "-5e-2"},
		{"1e-18446744073709551616", "1e-18446744073709551616"},
	}
	for _, tt := range tests {
		if got := string(appendCanonicalNumber(nil, []byte(tt.in))); got != tt.want {
			t.Errorf("%s -> %s, want %s", tt.in, got, tt.want)
		}
	}
}

// Two numbers have the same canonical form exactly when they have the same
// value, measured here with math/big.
func TestCanonicalNumberIsTheValue(t *testing.T) {
	t.Parallel()
	numbers := []string{
		"0", "-0", "0.0", "1", "-1", "1.0", "1.5", "15e-1", "0.15e1", "10", "1e1", "100", "1e2",
		"1e3", "1000.000", "0.1", "1e-1", "0.01", "1e-2", "-0.01", "123456789012345678901234567890",
		"1.23456789012345678901234567890e29", "123456789012345678901234567891", "0.30000000000000004",
		"0.3", "3e-1", "9007199254740993", "9007199254740992", "1.7976931348623157e308", "4.9e-324",
		"5e-324", "1e400", "10e399", "0.000001e406", "-2.50", "-25e-1", "7", "7.000000000000000000001",
	}
	rats := make([]*big.Rat, len(numbers))
	for i, n := range numbers {
		r, ok := new(big.Rat).SetString(n)
		if !ok {
			t.Fatalf("big.Rat cannot parse %s", n)
		}
		rats[i] = r
	}
	for i, a := range numbers {
		for j, b := range numbers {
			sameValue := rats[i].Cmp(rats[j]) == 0
			sameForm := string(appendCanonicalNumber(nil, []byte(a))) == string(appendCanonicalNumber(nil, []byte(b)))
			if sameValue != sameForm {
				t.Errorf("%s vs %s: same value %v, same canonical form %v", a, b, sameValue, sameForm)
			}
		}
	}
}
