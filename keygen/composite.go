package keygen

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/keygen/internal/fingerprinted"
)

// Composite keys a message by several generators at once, for example a
// tenant header and a content hash. Each part's key is written as its
// length in bytes, ':', and the key itself, and parts are separated by '|':
//
//	("a:b", "c") -> "3:a:b|1:c"
//	("a", "b:c") -> "1:a|3:b:c"
//
// The length prefix alone decides where a part ends, so no choice of part
// keys can make two different tuples produce the same composite key.
//
// A part's error is returned wrapped with its index; a part returning ""
// is ErrEmptyKey. Zero parts or a nil part is oncemill.ErrInvalidConfig.
func Composite(parts ...Generator) (Generator, error) {
	if len(parts) == 0 {
		return nil, configerr.New("keygen.Composite", "no parts; pass at least one generator")
	}
	for i, p := range parts {
		if p == nil {
			return nil, configerr.New("keygen.Composite", "part %d is nil; pass a generator", i)
		}
	}
	// Copy, so the caller reusing its slice cannot change the generator.
	c := &composite{parts: append([]Generator(nil), parts...)}
	return &fingerprinted.Generator{KeyFunc: c.key, FingerprintFunc: c.fingerprint}, nil
}

type composite struct {
	parts []Generator
}

func (c *composite) key(msg *message.Message) (string, error) {
	var small [4]string
	keys := small[:0]
	size := 0
	for i, p := range c.parts {
		k, err := p.Key(msg)
		if err == nil && k == "" {
			err = ErrEmptyKey
		}
		if err != nil {
			return "", fmt.Errorf("composite part %d: %w", i, err)
		}
		keys = append(keys, k)
		size += len(k) + 22 // a length of up to 20 digits, ':' and '|'
	}
	return joinLengthPrefixed(keys, size), nil
}

// fingerprint defers to the parts that fingerprint themselves: if any part
// is a Fingerprinter, the result joins those parts' fingerprints (and is ""
// when they are all "", as with a ContentHash part, so detection stays off).
// With no such part it is PayloadFingerprint.
func (c *composite) fingerprint(msg *message.Message) string {
	var small [4]string
	fps := small[:0]
	size, nonEmpty := 0, false
	for _, p := range c.parts {
		if f, ok := p.(Fingerprinter); ok {
			fp := f.Fingerprint(msg)
			fps = append(fps, fp)
			size += len(fp) + 22
			nonEmpty = nonEmpty || fp != ""
		}
	}
	if len(fps) == 0 {
		return PayloadFingerprint(msg)
	}
	if !nonEmpty {
		return ""
	}
	return joinLengthPrefixed(fps, size)
}

func joinLengthPrefixed(parts []string, size int) string {
	var b strings.Builder
	b.Grow(size)
	var num [20]byte
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('|')
		}
		b.Write(strconv.AppendInt(num[:0], int64(len(p)), 10))
		b.WriteByte(':')
		b.WriteString(p)
	}
	return b.String()
}
