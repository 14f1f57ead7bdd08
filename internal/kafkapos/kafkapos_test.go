package kafkapos

import (
	"errors"
	"testing"

	"github.com/oncemill/oncemill/store"
)

func TestKeyRoundTrips(t *testing.T) {
	for _, p := range []store.KafkaPosition{
		{Topic: "payments", Partition: 0, Offset: 0},
		{Topic: "a/b", Partition: 7, Offset: 1 << 40},
	} {
		got, err := Parse(Key(p))
		if err != nil || got != p {
			t.Errorf("Parse(Key(%+v)) = %+v, %v", p, got, err)
		}
	}
	if k := Key(store.KafkaPosition{Topic: "t", Partition: 3, Offset: 42}); k != "t/3/42" {
		t.Errorf("Key = %q, want the form of kafkakeys.Offset, t/3/42", k)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, key := range []string{"", "t", "t/1", "/1/2", "t/x/2", "t/1/x", "t/-1/2", "t/1/-2", "t/99999999999/1"} {
		if _, err := Parse(key); !errors.Is(err, store.ErrInvalidRequest) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidRequest", key, err)
		}
	}
}
