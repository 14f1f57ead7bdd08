package keygen

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Generator decides who a message is: two deliveries with the same key are the
// same logical message. A Generator must be safe for concurrent use.
type Generator interface {
	Key(msg *message.Message) (string, error)
}

// Fingerprinter is implemented by generators that know how to fingerprint the
// payload consistently with their key. Without it, the payload bytes are the
// fingerprint (see PayloadFingerprint).
type Fingerprinter interface {
	Fingerprint(msg *message.Message) string
}

// Func adapts a function to Generator.
type Func func(msg *message.Message) (string, error)

// Key calls f.
func (f Func) Key(msg *message.Message) (string, error) { return f(msg) }

// ErrNoKey is wrapped by every error a generator returns because the message
// does not carry a usable key. The pipeline treats it as a permanent failure.
var ErrNoKey = errors.New("oncemill: no key")
