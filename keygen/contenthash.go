package keygen

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/keygen/internal/fingerprinted"
)

// ContentHashOptions configures ContentHash.
type ContentHashOptions struct {
	// Exclude removes members before hashing, typically envelope fields a
	// producer changes when it re-sends (a timestamp, a trace id). A plain
	// name ("sent_at") removes that member in every object at any depth,
	// inside arrays too. A dotted path ("meta.sent_at") removes exactly that
	// member, reached from the root through objects only (never into
	// arrays). A member whose name contains '.' can only be removed through
	// a path that does not need that name as a segment, so avoid such names.
	Exclude []string

	// IncludeMetadata adds these metadata fields, name and value, to the
	// hash, so that for example a tenant header is part of the identity.
	// A missing field and an empty one hash the same. The order of the
	// names does not matter.
	IncludeMetadata []string

	// RejectNonJSON makes a payload that is not JSON as this package reads
	// it an error wrapping ErrNotJSON (and ErrNoKey), instead of keying it by
	// a hash of its raw bytes.
	RejectNonJSON bool
}

// ContentHash keys a message by its content: "sha256:" and the lowercase
// hex SHA-256 of a canonical form of the JSON payload, so the same JSON
// written differently (member order, whitespace, string escapes, number
// spelling) is the same message. Use it when producers re-send without a
// stable id. See docs/keys.md for the exact rules.
//
// A payload that is not JSON (syntax, invalid UTF-8, a duplicate object
// key, an unpaired surrogate escape, nesting deeper than 1000, or empty) is
// keyed by a hash of its raw bytes, domain-separated so it never equals the
// key of any JSON payload, unless RejectNonJSON.
//
// The generator implements Fingerprinter with an empty fingerprint: its key
// already covers the content, and a fingerprint of the raw payload would
// turn a changed excluded field into a mismatch.
func ContentHash(opts ContentHashOptions) (Generator, error) {
	ex, err := newExclusions(opts.Exclude)
	if err != nil {
		return nil, err
	}
	for _, name := range opts.IncludeMetadata {
		if name == "" {
			return nil, configerr.New("ContentHashOptions.IncludeMetadata", "an empty name; name each metadata field to include")
		}
	}
	meta := slices.Compact(slices.Sorted(slices.Values(opts.IncludeMetadata)))
	g := &contentHash{ex: ex, meta: meta, reject: opts.RejectNonJSON}
	// No fingerprint: the key is the content, so a key seen again always
	// comes with the same payload.
	return &fingerprinted.Generator{KeyFunc: g.key, FingerprintFunc: NoFingerprint}, nil
}

type contentHash struct {
	ex     exclusions
	meta   []string
	reject bool
}

// Domain bytes: the first byte hashed says what follows, so no raw payload
// can be crafted to hash like a canonical JSON form.
const (
	domainJSON = 'J'
	domainRaw  = 'R'
)

// hashState is the reusable working memory of one Key call.
type hashState struct {
	parser
	writer
	sum [sha256.Size]byte
	key [contentKeyLen]byte
}

// contentKeyLen is the length of a content key: "sha256:" and 64 hex digits.
const contentKeyLen = len("sha256:") + 2*sha256.Size

var hashStates = sync.Pool{
	New: func() any { return &hashState{writer: writer{h: sha256.New()}} },
}

// keepCap bounds the buffers kept in the pool, so one huge payload does not
// pin its working memory forever.
const keepCap = 1 << 16

func (s *hashState) release() {
	s.data, s.ex = nil, nil
	if cap(s.nodes) > keepCap {
		s.nodes = nil
	}
	if cap(s.order) > keepCap {
		s.order = nil
	}
	if cap(s.members) > keepCap {
		s.members = nil
	}
	if cap(s.arena) > keepCap {
		s.arena = nil
	}
	if cap(s.buf) > 2*flushAt {
		s.buf = nil
	}
	hashStates.Put(s)
}

func (g *contentHash) key(msg *message.Message) (string, error) {
	if msg == nil {
		return "", errNilMessage
	}
	s := hashStates.Get().(*hashState)
	defer s.release()

	isJSON := s.parse(msg.Payload, &g.ex)
	if !isJSON && g.reject {
		return "", s.notJSON()
	}

	s.reset()
	if isJSON {
		s.writeByte(domainJSON)
	} else {
		s.writeByte(domainRaw)
	}
	// The metadata block has a fixed shape (count, then length-prefixed
	// names and values) and the payload comes last, so the hashed bytes
	// split one way only.
	s.count(len(g.meta))
	for _, name := range g.meta {
		s.lengthPrefixed(name)
		s.lengthPrefixed(msg.Metadata.Get(name))
	}
	if isJSON {
		s.canonical(&s.parser, 0)
	} else {
		s.write(msg.Payload)
	}
	s.flush()

	s.h.Sum(s.sum[:0])
	copy(s.key[:], "sha256:")
	hex.Encode(s.key[len("sha256:"):], s.sum[:])
	return string(s.key[:]), nil
}
