package kafkakeys_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/kafkakeys"
)

// The offset key outside Kafka is a missing key, never a made-up one. (The
// key of a real Kafka delivery is tested through kfake in integration/.)
func TestOffsetWithoutKafkaIsNoKey(t *testing.T) {
	msg := message.NewMessage("m-1", []byte("{}"))
	msg.SetContext(context.Background())
	if _, err := kafkakeys.Offset().Key(msg); !errors.Is(err, keygen.ErrNoKey) || !strings.Contains(err.Error(), "no Kafka partition and offset") {
		t.Fatalf("Key of a message without a Kafka context = %v, want keygen.ErrNoKey saying it has no partition and offset", err)
	}
	if _, err := kafkakeys.Offset().Key(nil); !errors.Is(err, keygen.ErrNoKey) {
		t.Fatalf("Key(nil) = %v, want keygen.ErrNoKey", err)
	}
}

// Position outside Kafka has no position, never a made-up one (a real
// delivery's is tested through kfake in integration/: the watermark tests).
func TestPositionWithoutKafkaIsNoKey(t *testing.T) {
	msg := message.NewMessage("m-1", []byte("{}"))
	if _, err := kafkakeys.Position(msg); !strings.Contains(err.Error(), "no Kafka partition and offset") || !errors.Is(err, keygen.ErrNoKey) {
		t.Fatalf("Position of a message without a Kafka context = %v, want keygen.ErrNoKey saying it has no partition and offset", err)
	}
	if _, err := kafkakeys.Position(nil); !errors.Is(err, keygen.ErrNoKey) {
		t.Fatalf("Position(nil) = %v, want keygen.ErrNoKey", err)
	}
}
