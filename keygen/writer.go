package keygen

import (
	"encoding/binary"
	"hash"
)

// flushAt is how many canonical bytes are gathered before they are handed
// to the hash: one Write per token would cost more than the hashing.
const flushAt = 16 << 10

// writer streams the canonical form into a hash.
type writer struct {
	h   hash.Hash
	buf []byte
}

func (w *writer) reset() {
	w.h.Reset()
	w.buf = w.buf[:0]
}

func (w *writer) writeByte(c byte) { w.buf = append(w.buf, c) }

func (w *writer) writeString(s string) { w.buf = append(w.buf, s...) }

func (w *writer) write(b []byte) {
	if len(b) >= flushAt {
		w.flush()
		w.h.Write(b)
		return
	}
	w.buf = append(w.buf, b...)
	w.maybeFlush()
}

// count writes n as a fixed-width number.
func (w *writer) count(n int) {
	w.buf = binary.BigEndian.AppendUint64(w.buf, uint64(n))
}

// lengthPrefixed writes s after its length, so a sequence of them has only
// one reading.
func (w *writer) lengthPrefixed(s string) {
	w.buf = binary.BigEndian.AppendUint64(w.buf, uint64(len(s)))
	w.buf = append(w.buf, s...)
	w.maybeFlush()
}

func (w *writer) maybeFlush() {
	if len(w.buf) >= flushAt {
		w.flush()
	}
}

func (w *writer) flush() {
	w.h.Write(w.buf)
	w.buf = w.buf[:0]
}

// canonical writes value i of a successfully parsed payload:
//
//   - objects as {"k":v,...} with members sorted by the bytes of their
//     decoded names, excluded members left out;
//   - arrays as [v,...] in their order;
//   - strings as in canonicalString, numbers as in appendCanonicalNumber;
//   - true, false, null as themselves;
//   - no whitespace anywhere.
func (w *writer) canonical(p *parser, i int) {
	w.maybeFlush()
	n := &p.nodes[i]
	switch n.kind {
	case kindNull:
		w.writeString("null")
	case kindFalse:
		w.writeString("false")
	case kindTrue:
		w.writeString("true")
	case kindNumber:
		w.buf = appendCanonicalNumber(w.buf, p.data[n.start:n.end])
	case kindString:
		w.canonicalString(p.text(i), n.escaped)
	case kindArray:
		w.writeByte('[')
		for c := i + 1; c < int(n.next); c = int(p.nodes[c].next) {
			if c != i+1 {
				w.writeByte(',')
			}
			w.canonical(p, c)
		}
		w.writeByte(']')
	case kindObject:
		w.writeByte('{')
		for k, key := range p.order[n.start:n.end] {
			if k > 0 {
				w.writeByte(',')
			}
			w.canonicalString(p.text(int(key)), p.nodes[key].escaped)
			w.writeByte(':')
			w.canonical(p, int(key)+1)
		}
		w.writeByte('}')
	}
}

// canonicalString writes a decoded string in one spelling: '"' and '\'
// escaped with a backslash, \b \f \n \r \t for those controls, \u00xx
// (lowercase hex) for the other controls below U+0020, and every other
// character as its raw UTF-8 (so "\u0041" and "A", "\/" and "/" agree).
//
// A string that had no escapes in the payload cannot contain a byte that
// needs one (the parser rejects raw '"', '\' and controls), so it is
// written as it is.
func (w *writer) canonicalString(s []byte, escaped bool) {
	w.writeByte('"')
	if !escaped {
		w.write(s)
		w.writeByte('"')
		return
	}
	run := 0
	for k, c := range s {
		var esc string
		switch c {
		case '"':
			esc = `\"`
		case '\\':
			esc = `\\`
		case '\b':
			esc = `\b`
		case '\f':
			esc = `\f`
		case '\n':
			esc = `\n`
		case '\r':
			esc = `\r`
		case '\t':
			esc = `\t`
		default:
			if c >= 0x20 {
				continue
			}
		}
		w.write(s[run:k])
		run = k + 1
		if esc != "" {
			w.writeString(esc)
		} else {
			const hex = "0123456789abcdef"
			w.buf = append(w.buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	w.write(s[run:])
	w.writeByte('"')
}
