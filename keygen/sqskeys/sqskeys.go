package sqskeys

import (
	"github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/oncemill/oncemill/keygen"
)

// messageIDKey is the metadata field Unmarshaler sets to the SQS MessageId.
const messageIDKey = "sqs_message_id"

// Unmarshaler is a watermill-aws sqs.Unmarshaler that keeps the SQS
// MessageId, which watermill-aws drops, in the message's metadata under
// "sqs_message_id", where MessageID reads it. Next does the rest (nil: sqs.DefaultMarshalerUnmarshaler).
// Set it as the subscriber's sqs.SubscriberConfig.Unmarshaler.
type Unmarshaler struct {
	Next sqs.Unmarshaler
}

// Unmarshal implements sqs.Unmarshaler.
func (u Unmarshaler) Unmarshal(m *types.Message) (*message.Message, error) {
	next := u.Next
	if next == nil {
		next = sqs.DefaultMarshalerUnmarshaler{}
	}
	msg, err := next.Unmarshal(m)
	if err != nil || m.MessageId == nil {
		return msg, err
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(messageIDKey, *m.MessageId)
	return msg, nil
}

// MessageID keys a message by its SQS MessageId, which Unmarshaler puts in
// the metadata (the field "sqs_message_id", the same as
// keygen.Metadata("sqs_message_id")). A message without it (not read through Unmarshaler) has no
// key: an error wrapping keygen.ErrMissingMetadata.
//
// SQS gives a message one MessageId when it is sent, and every receive of it
// carries the same one, so the key catches what SQS itself redelivers: a
// visibility timeout that ran out, a delete that failed. It does not catch a
// message the producer sent twice: those are two MessageIds. Key those by
// the Watermill UUID or the content (docs/keys.md).
func MessageID() keygen.Generator {
	g, err := keygen.Metadata(messageIDKey)
	if err != nil {
		panic(err) // messageIDKey is not empty
	}
	return g
}
