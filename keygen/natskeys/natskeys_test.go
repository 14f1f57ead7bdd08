package natskeys_test

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/natskeys"
)

// natsURL is the NATS server with JetStream the tests use.
func natsURL() string { return cmp.Or(os.Getenv("ONCEMILL_NATS_URL"), "nats://127.0.0.1:4222") }

// testStream is a stream of one subject, both named uniquely for the test,
// deleted at its end, on a JetStream the test fails without.
func testStream(t *testing.T) (nats.JetStreamContext, string) {
	t.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS at %s does not answer (%v); start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server, or set ONCEMILL_NATS_URL", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	name := "natskeys_" + hex.EncodeToString(raw[:])
	if _, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
		t.Fatalf("creating stream %s (is JetStream on? nats-server -js): %v", name, err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(name) })
	return js, name
}

// A message published twice (the same UUID) is stored twice: two stream
// sequences, two keys. A Nak'd delivery comes back with its sequence, so
// the redelivery has the first delivery's key. Through watermill-nats's
// own marshaler, as its publisher and subscriber use it.
func TestSequenceOfRealDeliveries(t *testing.T) {
	js, stream := testStream(t)
	msg := message.NewMessage("m-1", []byte(`{"payment_id":"p-1"}`))
	for range 2 {
		nm, err := (&wnats.NATSMarshaler{}).Marshal(stream, msg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(nm); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := js.SubscribeSync(stream, nats.Durable("keys"), nats.ManualAck(), nats.AckExplicit())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	next := func() (*nats.Msg, string) {
		t.Helper()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("next delivery: %v", err)
		}
		wm, err := natskeys.Unmarshaler{}.Unmarshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if wm.UUID != "m-1" || string(wm.Payload) != `{"payment_id":"p-1"}` {
			t.Fatalf("unmarshaled %q %q: the next unmarshaler's work must stay", wm.UUID, wm.Payload)
		}
		key, err := natskeys.Sequence().Key(wm)
		if err != nil {
			t.Fatal(err)
		}
		return m, key
	}
	first, key1 := next()
	if err := first.Nak(); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for range 2 { // the redelivery and the second copy, in either order
		m, key := next()
		keys = append(keys, key)
		if err := m.AckSync(); err != nil {
			t.Fatal(err)
		}
	}
	if key1 != stream+"/1" {
		t.Errorf("first delivery's key %q, want %q", key1, stream+"/1")
	}
	want := map[string]bool{stream + "/1": true, stream + "/2": true}
	if len(keys) != 2 || keys[0] == keys[1] || !want[keys[0]] || !want[keys[1]] {
		t.Errorf("keys after the Nak %q, want the redelivery's %s/1 and the second copy's %s/2", keys, stream, stream)
	}

	// A stream deleted and created again numbers from 1 again: a new
	// message there gets the key of the first one above.
	_ = sub.Unsubscribe()
	if err := js.DeleteStream(stream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: stream, Subjects: []string{stream}}); err != nil {
		t.Fatal(err)
	}
	nm, _ := (&wnats.NATSMarshaler{}).Marshal(stream, message.NewMessage("m-1", []byte(`{"payment_id":"p-1"}`)))
	if _, err := js.PublishMsg(nm); err != nil {
		t.Fatal(err)
	}
	if sub, err = js.SubscribeSync(stream, nats.Durable("keys"), nats.ManualAck(), nats.AckExplicit()); err != nil {
		t.Fatal(err)
	}
	if _, key := next(); key != stream+"/1" {
		t.Errorf("the first message of the re-created stream has key %q, want %q", key, stream+"/1")
	}
}

// A message that is not a JetStream delivery (core NATS, or built by hand)
// has no key, never a made-up one.
func TestSequenceWithoutJetStreamIsNoKey(t *testing.T) {
	wm, err := natskeys.Unmarshaler{}.Unmarshal(&nats.Msg{Subject: "s", Data: []byte("{}"), Header: nats.Header{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*message.Message{wm, message.NewMessage("m-1", nil), nil} {
		if _, err := natskeys.Sequence().Key(m); !errors.Is(err, keygen.ErrNoKey) {
			t.Errorf("Key of a message without JetStream metadata = %v, want keygen.ErrNoKey", err)
		}
	}
	if _, err := natskeys.Sequence().Key(wm); !errors.Is(err, keygen.ErrMissingMetadata) {
		t.Errorf("Key = %v, want keygen.ErrMissingMetadata", err)
	}
}
