package memory_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// Each subtest has a store and a clock of its own, so Advance
		// moves no other subtest's time: the subtests may run in parallel.
		t.Parallel()
		clock := storetest.NewClock(epoch)
		s, err := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

// The suite again with one shard: every key contends for one lock and shares
// one token counter.
func TestContractOneShard(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// Each subtest has a store and a clock of its own, so Advance
		// moves no other subtest's time: the subtests may run in parallel.
		t.Parallel()
		clock := storetest.NewClock(epoch)
		s, err := memory.New(memory.Options{Shards: 1, Now: clock.Now, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts memory.Options
		want string // in the error message; "" means valid
	}{
		{"zero value", memory.Options{}, ""},
		{"one shard", memory.Options{Shards: 1}, ""},
		{"1024 shards", memory.Options{Shards: 1024}, ""},
		{"negative shards", memory.Options{Shards: -1}, "Options: Shards is -1"},
		{"shards not a power of two", memory.Options{Shards: 48}, "power of two"},
		{"too many shards", memory.Options{Shards: 1 << 17}, "at most 65536"},
		{"negative cleanup disables", memory.Options{CleanupInterval: -1}, ""},
		{"negative MaxKeyLen", memory.Options{MaxKeyLen: -5}, "Options: MaxKeyLen is -5"},
		{"MaxKeyLen beyond 4 GiB", memory.Options{MaxKeyLen: math.MaxInt}, "use at most 4294967295 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := memory.New(tt.opts)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("New accepted %+v", tt.opts)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestMaxKeyLen(t *testing.T) {
	t.Parallel()
	s, err := memory.New(memory.Options{MaxKeyLen: 8, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	if got := s.Limits().MaxKeyLen; got != 8 {
		t.Fatalf("MaxKeyLen() = %d, want 8", got)
	}
	ctx := context.Background()
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "12345678", LeaseDuration: time.Second}); err != nil {
		t.Fatalf("ClaimLease with an 8-byte key: %v", err)
	}
	_, err = s.ClaimLease(ctx, store.LeaseRequest{Key: "123456789", LeaseDuration: time.Second})
	if !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("ClaimLease with a 9-byte key: err = %v, want ErrInvalidRequest", err)
	}
	if !strings.Contains(err.Error(), "MaxKeyLen 8") {
		t.Errorf("error %q does not name the limit", err)
	}

	d, err := memory.New(memory.Options{CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.Limits().MaxKeyLen; got != 1024 {
		t.Fatalf("default MaxKeyLen() = %d, want 1024", got)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	s, err := memory.New(memory.Options{CleanupInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	ops := map[string]error{}
	_, ops["ClaimLease"] = s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	ops["Complete"] = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute})
	ops["Release"] = s.Release(ctx, res.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
	_, ops["Extend"] = s.Extend(ctx, res.Claim, time.Minute)
	_, ops["Get"] = s.Get(ctx, "", "k")
	ops["Delete"] = s.Delete(ctx, "", "k", res.Claim.Token)
	for op, err := range ops {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", op, err)
		}
	}
}
