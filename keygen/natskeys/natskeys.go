package natskeys

import (
	"fmt"
	"strconv"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/oncemill/oncemill/keygen"
)

// The metadata fields Unmarshaler sets and Sequence reads.
const (
	streamKey   = "nats_stream"
	sequenceKey = "nats_stream_seq"
)

// errNoSequence: the message was not read through Unmarshaler from a
// JetStream consumer, so it has no stream sequence.
var errNoSequence = fmt.Errorf("%w: %s and %s (not read through natskeys.Unmarshaler from a JetStream consumer)", keygen.ErrMissingMetadata, streamKey, sequenceKey)

// Unmarshaler is a watermill-nats (pkg/nats) Unmarshaler that keeps the
// JetStream metadata of a delivery, which watermill-nats drops, in the
// message's metadata: the stream's name under "nats_stream" and the
// message's stream sequence under "nats_stream_seq", where Sequence reads
// them. Next does the rest (nil: watermill-nats's NATSMarshaler). A message
// that is not a JetStream delivery (core NATS) gets neither field. Set it
// as the subscriber's nats.SubscriberConfig.Unmarshaler.
type Unmarshaler struct {
	Next wnats.Unmarshaler
}

// Unmarshal implements watermill-nats's Unmarshaler.
func (u Unmarshaler) Unmarshal(m *nats.Msg) (*message.Message, error) {
	next := u.Next
	if next == nil {
		next = &wnats.NATSMarshaler{}
	}
	msg, err := next.Unmarshal(m)
	if err != nil {
		return msg, err
	}
	md, err := m.Metadata() // parsed from the delivery's ack subject
	if err != nil {
		return msg, nil
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(streamKey, md.Stream)
	msg.Metadata.Set(sequenceKey, strconv.FormatUint(md.Sequence.Stream, 10))
	return msg, nil
}

// Sequence keys a message by where JetStream stored it: its stream and
// stream sequence, as "<stream>/<sequence>", from the metadata Unmarshaler
// sets. A message without them (not read through Unmarshaler, or not from
// JetStream) has no key: an error wrapping keygen.ErrMissingMetadata.
//
// A stream sequence names one stored message, and every redelivery of it
// carries the same one, so the key catches what JetStream itself
// redelivers: an AckWait that ran out, a Nak, a worker that crashed before
// its ack. It does not catch a message published twice (a retry after a
// lost publish ack past the stream's Nats-Msg-Id window, an outbox relayed
// twice): those are two sequences. Key those by the Watermill UUID or the
// content (docs/keys.md). A stream that is deleted and created again
// numbers its messages from 1 again: keep the key for streams you never
// re-create, as with Kafka offsets.
func Sequence() keygen.Generator { return keygen.Func(sequenceKeyOf) }

func sequenceKeyOf(msg *message.Message) (string, error) {
	if msg == nil {
		return "", fmt.Errorf("%w: message is nil", keygen.ErrNoKey)
	}
	stream, seq := msg.Metadata.Get(streamKey), msg.Metadata.Get(sequenceKey)
	if stream == "" || seq == "" {
		return "", errNoSequence
	}
	return stream + "/" + seq, nil
}
