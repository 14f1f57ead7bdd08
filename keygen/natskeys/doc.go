// Package natskeys has the key generator that knows NATS JetStream:
// Sequence keys a message by its stream and stream sequence, which the
// package's Unmarshaler keeps in the metadata for it. It is apart from
// package keygen so that keygen does not import a NATS client.
//
// Use Sequence when JetStream's own redeliveries (AckWait, a Nak, a crash)
// are the duplicates to catch. A message published twice is two stream
// sequences: key those by keygen.UUID or keygen.ContentHash.
package natskeys
