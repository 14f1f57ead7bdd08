package redisstore_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/storetest"
)

func TestWaitReplicasOptions(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": c.Options().Addr}})
	defer ring.Close()
	short := newClient(t, &redis.Options{ReadTimeout: 500 * time.Millisecond})
	tests := []struct {
		name   string
		client redis.UniversalClient
		opts   redisstore.Options
		want   string // in the error message; "" means valid
	}{
		{"one replica, default timeout", c, redisstore.Options{WaitReplicas: 1}, ""},
		{"negative replicas", c, redisstore.Options{WaitReplicas: -1}, "WaitReplicas: -1 is negative"},
		{"negative timeout", c, redisstore.Options{WaitReplicas: 1, WaitTimeout: -time.Second}, "WaitTimeout: -1s is negative"},
		{"timeout without replicas", c, redisstore.Options{WaitTimeout: time.Second}, "WaitReplicas is 0"},
		{"timeout below 1ms", c, redisstore.Options{WaitReplicas: 1, WaitTimeout: time.Microsecond}, "1ms resolution"},
		{"with AutoPipeline", c, redisstore.Options{WaitReplicas: 1, AutoPipeline: true}, "turn AutoPipeline off"},
		{"on a Ring", ring, redisstore.Options{WaitReplicas: 1}, "not *redis.Ring"},
		{"timeout not below ReadTimeout", short, redisstore.Options{WaitReplicas: 1}, "lower WaitTimeout or raise ReadTimeout"},
		{"timeout below ReadTimeout", short, redisstore.Options{WaitReplicas: 1, WaitTimeout: 400 * time.Millisecond}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := redisstore.New(tt.client, tt.opts)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want == "":
			case !errors.Is(err, oncemill.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("New(%+v) = %v, want a configuration error mentioning %q", tt.opts, err, tt.want)
			}
		})
	}
}

// waitTimeout is the bound of the tests' WAITs.
const waitTimeout = 500 * time.Millisecond

// newWaitStore starts a primary and a replica and returns a store on the
// primary that waits for the replica, and a client of the replica.
func newWaitStore(t *testing.T) (*redisstore.Store, replicated, *redis.Client) {
	t.Helper()
	rs := startReplicated(t)
	c := connect(t, rs.primary.addr, nil, "")
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), WaitReplicas: 1, WaitTimeout: waitTimeout})
	return s, rs, connect(t, rs.replica.addr, nil, "")
}

// notReplicated fails the test unless err is ErrNotReplicated's, returned
// within the bound (and the time a round trip may take on a busy machine).
func notReplicated(t *testing.T, what string, start time.Time, err error) {
	t.Helper()
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("%s with the replica stopped: %v, want ErrNotReplicated", what, err)
	}
	if took := time.Since(start); took > waitTimeout+2*time.Second {
		t.Fatalf("%s took %v, beyond WaitTimeout %v", what, took, waitTimeout)
	}
}

// TestWaitReplicas: with the replica acknowledging, a claim and its
// completion are on the replica when they return; with the replica
// stopped, each write fails with ErrNotReplicated within the bound, a
// failed claim leaves the key to the next claim of the message, and a
// completion tried again is not taken for written until the replica has it.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	s, rs, replica := newWaitStore(t)
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute, MessageUUID: "m1"}
	onReplica := func(key string) string {
		t.Helper()
		v, err := replica.Get(ctx, redisstore.KeysFor(s, "s", key)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return v
	}

	res, err := s.ClaimLease(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease with the replica up: %v %v", res.Decision, err)
	}
	if v := onReplica("k"); !strings.HasPrefix(v, "1|p|") {
		t.Fatalf("the replica holds %q after the claim returned, want the lease", v)
	}
	if res.Claim, err = s.Extend(ctx, res.Claim, time.Minute); err != nil {
		t.Fatalf("Extend with the replica up: %v", err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}); err != nil {
		t.Fatalf("Complete with the replica up: %v", err)
	}
	if v := onReplica("k"); !strings.HasPrefix(v, "1|s|") {
		t.Fatalf("the replica holds %q after Complete returned, want the success", v)
	}

	resume := rs.pause(t)
	// A replay is a read: it does not wait.
	if res, err := s.ClaimLease(ctx, req); err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("a replay with the replica stopped: %v %v, want replay", res.Decision, err)
	}
	req.Key = "k2"
	for try := range 2 {
		start := time.Now()
		_, err := s.ClaimLease(ctx, req)
		// Not Held on the second try: the first gave its lease back.
		notReplicated(t, "ClaimLease try "+string(rune('1'+try)), start, err)
	}
	resume()
	res, err = s.ClaimLease(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 {
		t.Fatalf("ClaimLease after the replica is back: %v attempt %d %v, want execute, attempt 1", res.Decision, res.Claim.Attempt, err)
	}

	resume = rs.pause(t)
	start := time.Now()
	_, err = s.Extend(ctx, res.Claim, time.Minute)
	notReplicated(t, "Extend", start, err)
	done := store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}
	for try := range 2 {
		start := time.Now()
		// The second try finds the success the first wrote, and still
		// fails: the replica has not acknowledged it.
		notReplicated(t, "Complete try "+string(rune('1'+try)), start, s.Complete(ctx, res.Claim, done))
	}
	resume()
	// The replica acknowledges it now: the lease is finished, as the
	// lease mode learns from the record (store.ErrLeaseLost, then Get).
	if err := s.Complete(ctx, res.Claim, done); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete again after the replica is back: %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "s", "k2"); err != nil || rec.Status != store.StatusSucceeded || rec.Token != res.Claim.Token {
		t.Fatalf("the record: %+v %v, want the lease's success", rec, err)
	}
	if v := onReplica("k2"); !strings.HasPrefix(v, "1|s|") {
		t.Fatalf("the replica holds %q, want the success", v)
	}

	req.Key = "k3"
	res, err = s.ClaimLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rs.pause(t)
	start = time.Now()
	notReplicated(t, "Release", start, s.Release(ctx, res.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}))
}

// TestWaitReplicasTakeover: a takeover whose WAIT fails leaves the lease it
// wrote expired, so the next claim takes the key over at once.
func TestWaitReplicasTakeover(t *testing.T) {
	t.Parallel()
	s, rs, _ := newWaitStore(t)
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: 10 * time.Second, MessageUUID: "m1"}
	if _, err := s.ClaimLease(ctx, req); err != nil {
		t.Fatal(err)
	}
	redisstore.AdvanceClock(s, 11*time.Second) // the first lease runs out
	resume := rs.pause(t)
	start := time.Now()
	_, err := s.ClaimLease(ctx, req)
	notReplicated(t, "the takeover", start, err)
	resume()
	res, err := s.ClaimLease(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute || !res.Takeover || res.Claim.Attempt != 3 {
		t.Fatalf("ClaimLease after the replica is back: %v takeover %v attempt %d %v, want a takeover, attempt 3",
			res.Decision, res.Takeover, res.Claim.Attempt, err)
	}
}

// TestContractWaitReplicas runs the contract suite with WaitReplicas 1
// against a primary with one replica.
func TestContractWaitReplicas(t *testing.T) {
	t.Parallel()
	rs := startReplicated(t)
	c := connect(t, rs.primary.addr, &redis.Options{PoolSize: 4}, "")
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		t.Parallel()
		s := newTestStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), WaitReplicas: 1, WaitTimeout: time.Second})
		return storetest.Harness{Store: s, Advance: func(d time.Duration) { redisstore.AdvanceClock(s, d) }, NativeExpiry: true}
	})
}

// TestWaitReplicasCluster: on a cluster the claim and its WAIT go to the
// key's master; the test cluster's masters have
// no replicas, so WAIT 1 answers 0 and each claim fails with
// ErrNotReplicated, never a silent success.
func TestWaitReplicasCluster(t *testing.T) {
	t.Parallel()
	c := clusterClient(t)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	for i := range 12 { // the store spreads their records over the masters
		key := "k" + strconv.Itoa(i)
		_, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute})
		if !errors.Is(err, redisstore.ErrNotReplicated) || !strings.Contains(err.Error(), "0 of 1 replicas") {
			t.Fatalf("ClaimLease(%q) on a cluster without replicas: %v, want ErrNotReplicated (0 of 1)", key, err)
		}
	}
}
