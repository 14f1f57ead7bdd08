package keygen

import "github.com/ThreeDotsLabs/watermill/message"

// UUID keys a message by its Watermill UUID. Use it when the producer sets
// the UUID once per logical message and keeps it when it re-sends; a
// producer that mints a new UUID per attempt defeats it (use Metadata or
// ContentHash then).
//
// Key does not allocate. An empty UUID is ErrEmptyKey.
func UUID() Generator { return uuidKeys }

// uuidKeys is a Func of a top-level function: storing it in the Generator
// interface allocates nothing.
var uuidKeys Generator = Func(uuidKey)

func uuidKey(msg *message.Message) (string, error) {
	if msg == nil {
		return "", errNilMessage
	}
	if msg.UUID == "" {
		return "", errEmptyUUID
	}
	return msg.UUID, nil
}
