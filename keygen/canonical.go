package keygen

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds how deeply objects and arrays may nest. Parsing and
// writing recurse once per level, so the bound keeps a hostile payload
// ("[[[[...") from exhausting the stack; deeper input is not JSON here.
const maxDepth = 1000

var tooDeep = fmt.Sprintf("objects and arrays nest deeper than %d levels", maxDepth)

// The parser reads the payload once, strictly by RFC 8259, and builds a flat
// tree: a slice of nodes in document order, where a container is followed
// by its children and knows the index just past its subtree. Objects get
// their members sorted here, so that a payload is fully checked (syntax,
// UTF-8, duplicate keys, depth) before a single byte is hashed, and writing
// the canonical form afterwards cannot fail.
type parser struct {
	data  []byte
	ex    *exclusions
	nodes []node
	// order holds, per object, the indexes of its kept members' key nodes
	// in sorted order; node.start:node.end of an object points into it.
	order []int32
	// members is a stack of the members of the objects being parsed.
	members []member
	// arena holds the decoded text of strings that contain escapes.
	arena []byte
	err   syntaxError
}

type nodeKind uint8

const (
	kindNull nodeKind = iota
	kindFalse
	kindTrue
	kindNumber
	kindString
	kindArray
	kindObject
)

// node is 16 bytes: a big payload has a node per few bytes of input, so
// the offsets are int32 (parse refuses payloads of 2 GiB and more).
type node struct {
	kind nodeKind
	// escaped: the string's decoded text is arena[start:end]; otherwise
	// it is data[start:end] exactly as written.
	escaped bool
	// String: its decoded text. Number: its text as written. Object: its
	// sorted member keys, order[start:end].
	start, end int32
	// next is the index of the first node after this value's subtree.
	next int32
}

// member is an object member while its object is parsed.
type member struct {
	key      int // index of the key's string node; the value follows it
	off      int // offset of the key in the payload, for errors
	excluded bool
}

// parse reports whether data is one JSON value this package canonicalises.
// If not, p.err says why.
func (p *parser) parse(data []byte, ex *exclusions) bool {
	p.data, p.ex = data, ex
	p.nodes, p.order, p.members, p.arena = p.nodes[:0], p.order[:0], p.members[:0], p.arena[:0]
	p.err = syntaxError{}
	if len(data) >= math.MaxInt32 {
		p.fail(errSyntax, 0, "payload of 2 GiB or more")
		return false
	}
	if n := min(len(data)/8, 1<<20); n > cap(p.nodes) {
		// JSON has a node per few bytes; growing from small by
		// appending would allocate several times the final size. The
		// bound keeps a big payload that is not JSON from costing much.
		p.nodes = make([]node, 0, n)
	}

	i := p.space(0)
	if i == len(data) {
		if len(data) == 0 {
			p.fail(errEmpty, 0, "empty payload")
		} else {
			p.fail(errEmpty, 0, "only whitespace")
		}
		return false
	}
	if i = p.value(i, 0, ex.root); i < 0 {
		return false
	}
	if i = p.space(i); i != len(data) {
		p.failChar(i, "after top-level value")
		return false
	}
	return true
}

// text is the decoded text of string node i.
func (p *parser) text(i int) []byte {
	n := &p.nodes[i]
	if n.escaped {
		return p.arena[n.start:n.end]
	}
	return p.data[n.start:n.end]
}

func (p *parser) space(i int) int {
	for i < len(p.data) {
		switch p.data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value parses the value starting at i (not at whitespace) and returns the
// offset after it, or -1 with p.err set. Every parse function does the same.
func (p *parser) value(i, depth int, path *pathNode) int {
	if i >= len(p.data) {
		return p.eof()
	}
	switch c := p.data[i]; {
	case c == '{':
		return p.object(i, depth+1, path)
	case c == '[':
		return p.array(i, depth+1)
	case c == '"':
		return p.str(i)
	case c == '-' || '0' <= c && c <= '9':
		return p.number(i)
	case c == 't':
		return p.literal(i, "true", kindTrue)
	case c == 'f':
		return p.literal(i, "false", kindFalse)
	case c == 'n':
		return p.literal(i, "null", kindNull)
	default:
		return p.failChar(i, "looking for beginning of value")
	}
}

func (p *parser) object(i, depth int, path *pathNode) int {
	if depth > maxDepth {
		return p.fail(errDepth, i, tooDeep)
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, node{kind: kindObject})
	base := len(p.members)

	i = p.space(i + 1)
	if i < len(p.data) && p.data[i] == '}' {
		i++
	} else {
		for {
			if i >= len(p.data) {
				return p.eof()
			}
			if p.data[i] != '"' {
				return p.failChar(i, "looking for beginning of object key string")
			}
			key, off := len(p.nodes), i
			if i = p.str(i); i < 0 {
				return -1
			}
			if i = p.space(i); i >= len(p.data) {
				return p.eof()
			}
			if p.data[i] != ':' {
				return p.failChar(i, "after object key")
			}
			excluded, child := p.ex.member(path, p.text(key))
			nodes, order := len(p.nodes), len(p.order)
			if i = p.value(p.space(i+1), depth, child); i < 0 {
				return -1
			}
			if excluded {
				// Parsed for validity only; forget its subtree.
				p.nodes, p.order = p.nodes[:nodes], p.order[:order]
			}
			p.members = append(p.members, member{key: key, off: off, excluded: excluded})

			if i = p.space(i); i >= len(p.data) {
				return p.eof()
			}
			if p.data[i] == '}' {
				i++
				break
			}
			if p.data[i] != ',' {
				return p.failChar(i, "after object key:value pair")
			}
			i = p.space(i + 1)
		}
	}

	ms := p.members[base:]
	if len(ms) > 1 {
		slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(p.text(a.key), p.text(b.key)) })
		for k := 1; k < len(ms); k++ {
			if bytes.Equal(p.text(ms[k-1].key), p.text(ms[k].key)) {
				// Parsers disagree on which duplicate wins, so the
				// payload has no single meaning to hash.
				p.fail(errDuplicate, max(ms[k-1].off, ms[k].off), "duplicate object key")
				p.err.key = ms[k].key
				return -1
			}
		}
	}
	start := len(p.order)
	for _, m := range ms {
		if !m.excluded {
			p.order = append(p.order, int32(m.key))
		}
	}
	p.members = p.members[:base]
	p.nodes[idx].start, p.nodes[idx].end, p.nodes[idx].next = int32(start), int32(len(p.order)), int32(len(p.nodes))
	return i
}

func (p *parser) array(i, depth int) int {
	if depth > maxDepth {
		return p.fail(errDepth, i, tooDeep)
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, node{kind: kindArray})

	i = p.space(i + 1)
	if i < len(p.data) && p.data[i] == ']' {
		i++
	} else {
		for {
			// Dotted paths go through objects only, so nil.
			if i = p.value(i, depth, nil); i < 0 {
				return -1
			}
			if i = p.space(i); i >= len(p.data) {
				return p.eof()
			}
			if p.data[i] == ']' {
				i++
				break
			}
			if p.data[i] != ',' {
				return p.failChar(i, "after array element")
			}
			i = p.space(i + 1)
		}
	}
	p.nodes[idx].next = int32(len(p.nodes))
	return i
}

// stringSpecial marks the bytes that end a run of plain string bytes.
var stringSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	for c := 0x80; c < 0x100; c++ {
		t[c] = true
	}
	return t
}()

// str parses a string. A string without escapes is kept as a slice of the
// payload; the first escape switches to decoding into the arena.
func (p *parser) str(i int) int {
	data := p.data
	start := i + 1
	j := start
	escaped, arenaStart := false, 0
	for {
		run := j
		for j < len(data) && !stringSpecial[data[j]] {
			j++
		}
		if escaped {
			p.arena = append(p.arena, data[run:j]...)
		}
		if j >= len(data) {
			return p.eof()
		}
		switch c := data[j]; {
		case c == '"':
			n := node{kind: kindString, start: int32(start), end: int32(j), next: int32(len(p.nodes) + 1)}
			if escaped {
				n.escaped, n.start, n.end = true, int32(arenaStart), int32(len(p.arena))
			}
			p.nodes = append(p.nodes, n)
			return j + 1
		case c == '\\':
			if !escaped {
				escaped, arenaStart = true, len(p.arena)
				p.arena = append(p.arena, data[start:j]...)
			}
			if j = p.escape(j); j < 0 {
				return -1
			}
		case c < 0x20:
			return p.failChar(j, "in string literal")
		default:
			r, size := utf8.DecodeRune(data[j:])
			if r == utf8.RuneError && size == 1 {
				return p.fail(errUTF8, j, "invalid UTF-8 in string")
			}
			if escaped {
				p.arena = append(p.arena, data[j:j+size]...)
			}
			j += size
		}
	}
}

// escape decodes the escape sequence at j into the arena.
func (p *parser) escape(j int) int {
	data := p.data
	if j+1 >= len(data) {
		return p.eof()
	}
	var c byte
	switch data[j+1] {
	case '"', '\\', '/':
		c = data[j+1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		return p.unicodeEscape(j)
	default:
		return p.failChar(j+1, "in string escape code")
	}
	p.arena = append(p.arena, c)
	return j + 2
}

// unicodeEscape decodes \uXXXX at j, and the low half that must follow a
// high surrogate. An unpaired surrogate is rejected rather than replaced
// with U+FFFD: replacing would make two different strings hash the same.
func (p *parser) unicodeEscape(j int) int {
	r, k := p.hex4(j + 2)
	if k < 0 {
		return -1
	}
	if utf16.IsSurrogate(r) {
		if r >= 0xDC00 {
			return p.fail(errSurrogate, j, "unpaired UTF-16 surrogate in \\u escape")
		}
		if k+1 >= len(p.data) || p.data[k] != '\\' || p.data[k+1] != 'u' {
			return p.fail(errSurrogate, j, "unpaired UTF-16 surrogate in \\u escape")
		}
		low, next := p.hex4(k + 2)
		if next < 0 {
			return -1
		}
		if low < 0xDC00 || low > 0xDFFF {
			return p.fail(errSurrogate, j, "unpaired UTF-16 surrogate in \\u escape")
		}
		r, k = utf16.DecodeRune(r, low), next
	}
	p.arena = utf8.AppendRune(p.arena, r)
	return k
}

func (p *parser) hex4(i int) (rune, int) {
	var r rune
	for k := i; k < i+4; k++ {
		if k >= len(p.data) {
			return 0, p.eof()
		}
		c := p.data[k]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, p.failChar(k, "in \\u hexadecimal character escape")
		}
		r = r<<4 | rune(c)
	}
	return r, i + 4
}

// number checks the JSON number grammar; canonicalNumber normalises it
// when it is written.
func (p *parser) number(i int) int {
	data := p.data
	start := i
	if data[i] == '-' {
		i++
	}
	if i >= len(data) {
		return p.eof()
	}
	switch c := data[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i = digits(data, i+1)
	default:
		return p.failChar(i, "in numeric literal")
	}
	if i < len(data) && data[i] == '.' {
		if i++; i >= len(data) {
			return p.eof()
		}
		if !isDigit(data[i]) {
			return p.failChar(i, "after decimal point in numeric literal")
		}
		i = digits(data, i)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		if i++; i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) {
			return p.eof()
		}
		if !isDigit(data[i]) {
			return p.failChar(i, "in exponent of numeric literal")
		}
		i = digits(data, i)
	}
	p.nodes = append(p.nodes, node{kind: kindNumber, start: int32(start), end: int32(i), next: int32(len(p.nodes) + 1)})
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

func (p *parser) literal(i int, word string, kind nodeKind) int {
	for k := range len(word) {
		if i+k >= len(p.data) {
			return p.eof()
		}
		if p.data[i+k] != word[k] {
			return p.failChar(i+k, "in literal "+word)
		}
	}
	p.nodes = append(p.nodes, node{kind: kind, next: int32(len(p.nodes) + 1)})
	return i + len(word)
}
