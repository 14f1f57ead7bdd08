package keygen_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

// paymentJSON is a realistic payment event of about 300 bytes.
const paymentJSON = `{"type":"payment.captured","payment_id":"pay_01HZX3K9Q7","order_id":"ord_88231",` +
	`"amount":{"value":129.90,"currency":"EUR"},"customer":{"id":"cus_4412","country":"DE"},` +
	`"method":{"kind":"card","brand":"visa","last4":"4242"},` +
	`"meta":{"source":"checkout","attempt":1,"sent_at":"2026-03-01T10:15:30.123Z","trace_id":"4bf92f3577b34da6"}}`

func benchKey(b *testing.B, g keygen.Generator, msg *message.Message) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Key(msg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUUID(b *testing.B) {
	benchKey(b, keygen.UUID(), message.NewMessage("8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10", []byte(paymentJSON)))
}

func BenchmarkMetadata(b *testing.B) {
	g, _ := keygen.Metadata("Idempotency-Key")
	msg := message.NewMessage("1", []byte(paymentJSON))
	msg.Metadata.Set("Idempotency-Key", "pay_01HZX3K9Q7")
	benchKey(b, g, msg)
}

func BenchmarkContentHash(b *testing.B) {
	g := newContentHash(b, keygen.ContentHashOptions{Exclude: []string{"meta.sent_at"}})
	b.SetBytes(int64(len(paymentJSON)))
	benchKey(b, g, message.NewMessage("1", []byte(paymentJSON)))
}

func BenchmarkContentHashLarge(b *testing.B) {
	g := newContentHash(b, keygen.ContentHashOptions{Exclude: []string{"sent_at"}})
	payload := largeJSON(64<<10, false)
	b.SetBytes(int64(len(payload)))
	benchKey(b, g, message.NewMessage("1", payload))
}

func BenchmarkComposite(b *testing.B) {
	tenant, _ := keygen.Metadata("tenant")
	g, _ := keygen.Composite(tenant, keygen.UUID())
	msg := message.NewMessage("8c2f0b1e-5d1a-4a34-9a57-0f8a4a5c2f10", []byte(paymentJSON))
	msg.Metadata.Set("tenant", "acme")
	benchKey(b, g, msg)
}

func BenchmarkFunc(b *testing.B) {
	g := keygen.Func(func(msg *message.Message) (string, error) { return msg.Metadata.Get("order"), nil })
	msg := message.NewMessage("1", []byte(paymentJSON))
	msg.Metadata.Set("order", "ord_88231")
	benchKey(b, g, msg)
}

func BenchmarkPayloadFingerprint(b *testing.B) {
	msg := message.NewMessage("1", []byte(paymentJSON))
	b.ReportAllocs()
	b.SetBytes(int64(len(msg.Payload)))
	for b.Loop() {
		_ = keygen.PayloadFingerprint(msg)
	}
}

func BenchmarkStorableKey(b *testing.B) {
	long := strings.Repeat("k", 10<<10)
	b.Run("short", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = keygen.StorableKey("order-42", 255)
		}
	})
	b.Run("10KB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = keygen.StorableKey(long, 255)
		}
	})
}
