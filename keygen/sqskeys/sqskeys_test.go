package sqskeys_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/sqskeys"
)

// The unmarshaler keeps the MessageId beside what the default one reads, and
// the generator keys by it; without it there is no key. (A real SQS delivery
// is tested through fauxqs in integration/.)
func TestMessageIDFromTheUnmarshaler(t *testing.T) {
	msg, err := sqskeys.Unmarshaler{}.Unmarshal(&types.Message{
		MessageId: aws.String("5fea7756-0ea4-451a-a703-a558b933e274"),
		Body:      aws.String(`{"amount":100}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	key, err := sqskeys.MessageID().Key(msg)
	if err != nil || key != "5fea7756-0ea4-451a-a703-a558b933e274" || string(msg.Payload) != `{"amount":100}` {
		t.Fatalf("key %q, %v; payload %q", key, err, msg.Payload)
	}
	if got := msg.Metadata.Get("sqs_message_id"); got != key {
		t.Fatalf("metadata sqs_message_id = %q, want the MessageId %q (the field the documentation names)", got, key)
	}
	if _, err := sqskeys.MessageID().Key(message.NewMessage("m-1", nil)); !errors.Is(err, keygen.ErrNoKey) {
		t.Fatalf("Key of a message not read through the unmarshaler = %v, want keygen.ErrNoKey", err)
	}
}
