package keygen_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

// The broker recipes of docs/keys.md, as the generators see them.

// SQS: watermill-aws takes the UUID from the _watermill_message_uuid
// attribute, or else from the SQS MessageId, which is new for every
// SendMessage. A producer that is not Watermill and re-sends therefore
// arrives with a new UUID: only the content recognises it.
func TestRecipeSQSResendWithNewMessageID(t *testing.T) {
	t.Parallel()
	first := message.NewMessage("sqs-message-id-1", []byte(`{"order":7,"amount":"10.50","sent_at":"10:00"}`))
	resent := message.NewMessage("sqs-message-id-2", []byte(`{"amount":"10.50","order":7,"sent_at":"10:01"}`))

	if mustKey(t, keygen.UUID(), first) == mustKey(t, keygen.UUID(), resent) {
		t.Fatal("UUID keys match; the recipe assumes they do not")
	}
	content := newContentHash(t, keygen.ContentHashOptions{Exclude: []string{"sent_at"}})
	if mustKey(t, content, first) != mustKey(t, content, resent) {
		t.Error("ContentHash did not recognise the re-send")
	}
}

// A producer-set id in a header (Kafka record header, AMQP header, SQS
// message attribute all become Watermill metadata) survives re-sends when
// the producer keeps it.
func TestRecipeProducerHeader(t *testing.T) {
	t.Parallel()
	g, err := keygen.Metadata("Idempotency-Key")
	if err != nil {
		t.Fatal(err)
	}
	first := msgWith(`{"order":7}`, "Idempotency-Key", "ord-7")
	first.UUID = "uuid-1"
	resent := msgWith(`{"order":7}`, "Idempotency-Key", "ord-7")
	resent.UUID = "uuid-2"
	other := msgWith(`{"order":8}`, "Idempotency-Key", "ord-8")
	if mustKey(t, g, first) != mustKey(t, g, resent) || mustKey(t, g, first) == mustKey(t, g, other) {
		t.Error("header key does not follow the producer's id")
	}
}

// Several tenants may send the same body; the tenant header makes them
// different messages, in a Composite or through IncludeMetadata.
func TestRecipeTenantScopedContent(t *testing.T) {
	t.Parallel()
	tenant, _ := keygen.Metadata("tenant")
	content := newContentHash(t, keygen.ContentHashOptions{})
	composite := mustComposite(t, tenant, content)
	included := newContentHash(t, keygen.ContentHashOptions{IncludeMetadata: []string{"tenant"}})

	a := msgWith(`{"order":7}`, "tenant", "acme")
	b := msgWith(`{"order":7}`, "tenant", "globex")
	for name, g := range map[string]keygen.Generator{"Composite": composite, "IncludeMetadata": included} {
		if mustKey(t, g, a) == mustKey(t, g, b) {
			t.Errorf("%s: two tenants share a key", name)
		}
		if mustKey(t, g, a) != mustKey(t, g, msgWith(`{"order":7}`, "tenant", "acme")) {
			t.Errorf("%s: the same tenant and body differ", name)
		}
	}
	if _, err := composite.Key(msgWith(`{"order":7}`)); err == nil {
		t.Error("Composite: a missing tenant header must be an error")
	}
	if _, err := included.Key(msgWith(`{"order":7}`)); err != nil {
		t.Errorf("IncludeMetadata: a missing tenant header hashes as empty, got %v", err)
	}
}
