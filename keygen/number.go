package keygen

import (
	"math/big"
	"strconv"
)

// appendCanonicalNumber appends the one spelling of the value of a JSON
// number (already checked against the grammar): an optional '-', the
// significant digits with no leading or trailing zeros, and, unless it is
// zero, 'e' and the decimal exponent that scales those digits as an integer:
//
//	1, 1.0, 1e0, 10e-1, 0.1e1 -> 1
//	100, 1e2, 0.01e4          -> 1e2
//	1.5, 15e-1                -> 15e-1
//	0, -0, 0.0e7              -> 0
//
// It works on the decimal text, never through float64, so every digit of
// 12345678901234567890123 counts and equal values always meet.
func appendCanonicalNumber(dst, num []byte) []byte {
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	mantEnd, expStart := len(num), len(num)
	for k, c := range num {
		if c == 'e' || c == 'E' {
			mantEnd, expStart = k, k+1
			break
		}
	}
	intPart, frac := num[:mantEnd], []byte(nil)
	for k, c := range intPart {
		if c == '.' {
			intPart, frac = num[:k], num[k+1:mantEnd]
			break
		}
	}

	// The digits intPart+frac read as one integer D; the value is
	// D * 10^(exp - len(frac)). Find D's first and last non-zero digit.
	first, last := -1, -1
	total := len(intPart) + len(frac)
	digit := func(k int) byte {
		if k < len(intPart) {
			return intPart[k]
		}
		return frac[k-len(intPart)]
	}
	for k := 0; k < total; k++ {
		if digit(k) != '0' {
			first = k
			break
		}
	}
	if first < 0 {
		return append(dst, '0')
	}
	for k := total - 1; k >= first; k-- {
		if digit(k) != '0' {
			last = k
			break
		}
	}
	if neg {
		dst = append(dst, '-')
	}
	for k := first; k <= last; {
		if k < len(intPart) {
			end := min(last+1, len(intPart))
			dst = append(dst, intPart[k:end]...)
			k = end
		} else {
			dst = append(dst, frac[k-len(intPart):last+1-len(intPart)]...)
			k = last + 1
		}
	}

	// Dropping the trailing zeros and the fraction moves the exponent.
	shift := int64(total-1-last) - int64(len(frac))
	exp := num[expStart:]
	expNeg := false
	if len(exp) > 0 && (exp[0] == '+' || exp[0] == '-') {
		expNeg = exp[0] == '-'
		exp = exp[1:]
	}
	for len(exp) > 1 && exp[0] == '0' {
		exp = exp[1:]
	}
	if len(exp) > 18 {
		// Beyond int64: rare and hostile, so exact and slow.
		e, _ := new(big.Int).SetString(string(exp), 10)
		if expNeg {
			e.Neg(e)
		}
		e.Add(e, big.NewInt(shift))
		if e.Sign() == 0 {
			return dst
		}
		return e.Append(append(dst, 'e'), 10)
	}
	var e int64
	for _, c := range exp {
		e = e*10 + int64(c-'0')
	}
	if expNeg {
		e = -e
	}
	// |e| < 10^18 and |shift| is at most the payload length: no overflow.
	if e += shift; e == 0 {
		return dst
	}
	return strconv.AppendInt(append(dst, 'e'), e, 10)
}
