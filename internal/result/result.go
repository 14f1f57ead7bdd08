// Package result is the encoding of a success's stored result: the
// messages the handler produced, which a duplicate is answered with. The
// idempotency stage writes and reads it; the operator's CLI reads it.
package result

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The stored result is the handler's produced messages in a small binary
// form: a version byte, a flags byte, then each message's UUID, metadata
// (sorted by name, so equal results encode equally) and payload, each
// length-prefixed with a uvarint.
const (
	resultVersion = 1
	// flagOmitted marks a result that was over policy.MaxResultBytes: the
	// success is remembered but its produced messages cannot be replayed.
	flagOmitted = 1
)

// ErrCorrupt: a stored result cannot be decoded.
var ErrCorrupt = errors.New("oncemill: stored result is corrupt")

// errTooLarge is internal: Encode returns it with the omitted marker.
var errTooLarge = errors.New("oncemill: produced messages exceed the maximum result size")

var omittedResult = []byte{resultVersion, flagOmitted}

// Encode returns nil for a success that produced nothing: the common
// consumer handler then stores no result bytes at all.
func Encode(msgs []*message.Message, maxBytes int) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	size := 2 + binary.MaxVarintLen64
	for _, m := range msgs {
		size += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			size += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	buf := make([]byte, 0, size)
	buf = append(buf, resultVersion, 0)
	buf = binary.AppendUvarint(buf, uint64(len(msgs)))
	var names []string
	for _, m := range msgs {
		buf = appendString(buf, m.UUID)
		names = names[:0]
		for k := range m.Metadata {
			names = append(names, k)
		}
		slices.Sort(names)
		buf = binary.AppendUvarint(buf, uint64(len(names)))
		for _, k := range names {
			buf = appendString(buf, k)
			buf = appendString(buf, m.Metadata[k])
		}
		buf = binary.AppendUvarint(buf, uint64(len(m.Payload)))
		buf = append(buf, m.Payload...)
	}
	if len(buf) > maxBytes {
		return omittedResult, fmt.Errorf("%w: %d bytes, limit %d (policy.MaxResultBytes)", errTooLarge, len(buf), maxBytes)
	}
	return buf, nil
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// Decode returns the stored messages, and omitted=true when the result
// was too large to keep; an error wrapping ErrCorrupt means the bytes are
// not a result of this encoding.
func Decode(b []byte) (msgs []*message.Message, omitted bool, err error) {
	if len(b) == 0 {
		return nil, false, nil // a success that produced nothing
	}
	if len(b) < 2 || b[0] != resultVersion {
		return nil, false, fmt.Errorf("%w: unknown header", ErrCorrupt)
	}
	if b[1]&flagOmitted != 0 {
		return nil, true, nil
	}
	d := decoder{b: b[2:]}
	n := d.uvarint()
	if n > uint64(len(d.b)) { // every message takes at least one byte
		return nil, false, fmt.Errorf("%w: %d messages in %d bytes", ErrCorrupt, n, len(d.b))
	}
	msgs = make([]*message.Message, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		uuid := d.string()
		nmeta := d.uvarint()
		var meta message.Metadata
		if nmeta > 0 && nmeta <= uint64(len(d.b)) {
			meta = make(message.Metadata, nmeta)
		}
		for j := uint64(0); j < nmeta && d.err == nil; j++ {
			k := d.string()
			meta[k] = d.string()
		}
		payload := d.bytes()
		if d.err != nil {
			break
		}
		m := message.NewMessage(uuid, payload)
		if meta != nil {
			m.Metadata = meta
		}
		msgs = append(msgs, m)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrCorrupt, d.err)
	}
	return msgs, false, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("bad length")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d past the end", n)
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) string() string { return string(d.bytes()) }
