package result

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

func TestResultRoundTrip(t *testing.T) {
	t.Parallel()
	a := message.NewMessage("uuid-a", []byte("payload a"))
	a.Metadata.Set("z", "last")
	a.Metadata.Set("a", "first")
	b := message.NewMessage("uuid-b", nil)
	empty := message.NewMessage("", []byte{})
	for _, msgs := range [][]*message.Message{nil, {a}, {a, b, empty}} {
		enc, err := Encode(msgs, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		got, omitted, err := Decode(enc)
		if err != nil || omitted || len(got) != len(msgs) {
			t.Fatalf("decode: %v omitted=%v len=%d want %d", err, omitted, len(got), len(msgs))
		}
		for i := range msgs {
			if !got[i].Equals(msgs[i]) {
				t.Fatalf("message %d: got %+v want %+v", i, got[i], msgs[i])
			}
		}
	}
}

func TestResultEncodingIsDeterministic(t *testing.T) {
	t.Parallel()
	m := message.NewMessage("u", []byte("p"))
	for i := 0; i < 20; i++ {
		m.Metadata.Set(strings.Repeat("k", i+1), "v")
	}
	first, _ := Encode([]*message.Message{m}, 1<<20)
	for i := 0; i < 10; i++ {
		again, _ := Encode([]*message.Message{m}, 1<<20)
		if string(again) != string(first) {
			t.Fatal("map iteration order leaked into the encoding")
		}
	}
}

func TestResultOverTheLimitIsOmitted(t *testing.T) {
	t.Parallel()
	enc, err := Encode([]*message.Message{message.NewMessage("u", make([]byte, 100))}, 50)
	if !errors.Is(err, errTooLarge) || !strings.Contains(err.Error(), "limit 50") {
		t.Fatalf("got %v", err)
	}
	msgs, omitted, err := Decode(enc)
	if err != nil || !omitted || msgs != nil {
		t.Fatalf("decode of an omitted result: %v %v %v", msgs, omitted, err)
	}
}

func TestCorruptResultsAreErrorsNotPanics(t *testing.T) {
	t.Parallel()
	good, _ := Encode([]*message.Message{message.NewMessage("uuid", []byte("payload"))}, 1<<20)
	inputs := [][]byte{
		{9},                                  // unknown version
		{resultVersion, 0, 0xff},             // bad count varint
		{resultVersion, 0, 200},              // more messages than bytes
		good[:len(good)-1],                   // truncated payload
		append(append([]byte{}, good...), 0), // trailing bytes
	}
	for i := 3; i < len(good); i++ {
		inputs = append(inputs, good[:i])
	}
	for _, in := range inputs {
		if _, _, err := Decode(in); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decode(%v) = %v, want ErrCorrupt", in, err)
		}
	}
}

func FuzzDecodeResult(f *testing.F) {
	good, _ := Encode([]*message.Message{message.NewMessage("uuid", []byte("payload"))}, 1<<20)
	f.Add(good)
	f.Add([]byte{resultVersion, flagOmitted})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, _, err := Decode(b)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to a result that decodes the same.
		enc, err := Encode(msgs, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		again, _, err := Decode(enc)
		if err != nil || len(again) != len(msgs) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}
