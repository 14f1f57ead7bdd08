// Package fingerprinted holds the generator a keygen constructor returns
// when it fingerprints the payload its own way. It lives apart so that its
// methods are not part of package keygen's API.
package fingerprinted

import "github.com/ThreeDotsLabs/watermill/message"

// Generator is a key function with a fingerprint of its own: a
// keygen.Generator and a keygen.Fingerprinter.
type Generator struct {
	KeyFunc         func(*message.Message) (string, error)
	FingerprintFunc func(*message.Message) string
}

func (g *Generator) Key(msg *message.Message) (string, error) { return g.KeyFunc(msg) }
func (g *Generator) Fingerprint(msg *message.Message) string  { return g.FingerprintFunc(msg) }
