package keygen

import (
	"fmt"
	"strconv"
)

// errKind says why a payload is not JSON to this package. Tests use it to
// tell "not JSON at all" from "JSON we refuse" (duplicates, depth, lone
// surrogates), which encoding/json would accept.
type errKind uint8

const (
	errSyntax errKind = iota + 1
	errEmpty
	errUTF8
	errSurrogate
	errDuplicate
	errDepth
)

// syntaxError is recorded by the parser without allocating; it becomes an
// error value only when RejectNonJSON asks for one.
type syntaxError struct {
	kind errKind
	off  int
	msg  string
	// char is the offending byte when hasChar.
	char    byte
	hasChar bool
	// key is the node of the duplicate key when kind is errDuplicate.
	key int
}

func (p *parser) fail(kind errKind, off int, msg string) int {
	p.err = syntaxError{kind: kind, off: off, msg: msg}
	return -1
}

func (p *parser) failChar(off int, msg string) int {
	p.err = syntaxError{kind: errSyntax, off: off, msg: msg, char: p.data[off], hasChar: true}
	return -1
}

func (p *parser) eof() int {
	return p.fail(errSyntax, len(p.data), "unexpected end of payload")
}

// notJSON turns the recorded failure into an error wrapping ErrNotJSON, in
// the words of encoding/json where there is an equivalent.
func (p *parser) notJSON() error {
	e := p.err
	detail := e.msg
	switch {
	case e.hasChar:
		detail = "invalid character " + quoteByte(e.char) + " " + e.msg
	case e.kind == errDuplicate:
		name := p.text(e.key)
		if len(name) > 64 {
			detail = fmt.Sprintf("%s %q...", e.msg, name[:64])
		} else {
			detail = fmt.Sprintf("%s %q", e.msg, name)
		}
	}
	return fmt.Errorf("%w at offset %d: %s", ErrNotJSON, e.off, detail)
}

func quoteByte(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	case c < 0x20:
		return strconv.QuoteRune(rune(c))
	default:
		return fmt.Sprintf("byte 0x%02x", c)
	}
}
