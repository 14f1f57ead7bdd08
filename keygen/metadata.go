package keygen

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/configerr"
)

// Metadata keys a message by one metadata field, such as an idempotency key
// header the producer sets and keeps across re-sends. A missing or empty
// field wraps ErrMissingMetadata and names the field. An empty field name is oncemill.ErrInvalidConfig.
func Metadata(field string) (Generator, error) {
	if field == "" {
		return nil, configerr.New("keygen.Metadata", "the field name is empty; name the metadata field that holds the key")
	}
	return Func(func(msg *message.Message) (string, error) {
		if msg == nil {
			return "", errNilMessage
		}
		if v := msg.Metadata.Get(field); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: %q", ErrMissingMetadata, field)
	}), nil
}
