package integration

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// kfake drops the JoinGroup of a member whose session timer runs out while
// it waits in a rebalance for a slower member: the member is removed and
// its JoinGroup is never answered, so the client waits for its network read
// timeout (sarama's Net.ReadTimeout, 30 s by default). Kafka keeps a member
// that waits in a join alive and answers a removed member's join with an
// error. Three members, on sarama's request API: A and B form a group; C
// joins, A rejoins at once and stops heartbeating (as a sarama member does
// once its session is over), B goes on heartbeating without rejoining (a
// member whose ConsumeClaim has not returned). The rebalance ends without B
// after the rebalance timeout; C is answered then, A never. This is how a
// consumer group stalled for 30–65 s after a database outage
// (TestKafkaGroupProgressesAfterDatabaseOutage, docs/kafka.md): the
// example worker bounds the wait with the rebalance timeout and
// Net.ReadTimeout.
func TestKfakeDropsJoinOfMemberWhoseSessionExpires(t *testing.T) {
	t.Parallel()
	const (
		session     = time.Second // kfake's smallest here (startKafka)
		rebalance   = 3 * time.Second
		readTimeout = 8 * time.Second
	)
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	group, topic := "it_join_"+hex.EncodeToString(raw[:]), "it_join_"+hex.EncodeToString(raw[:])
	createKafkaTopic(t, topic)

	connect := func() *sarama.Broker {
		cfg := sarama.NewConfig()
		cfg.Version = sarama.V2_8_0_0
		cfg.Net.ReadTimeout = readTimeout
		b := sarama.NewBroker(env.kafkaAddr)
		must(t, b.Open(cfg))
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	// join joins as memberID ("" for a new member) and returns the answer.
	join := func(b *sarama.Broker, memberID string) (*sarama.JoinGroupResponse, error) {
		for {
			req := sarama.NewJoinGroupRequest(sarama.V2_8_0_0)
			req.GroupId, req.MemberId, req.ProtocolType = group, memberID, "consumer"
			req.SessionTimeout, req.RebalanceTimeout = int32(session/time.Millisecond), int32(rebalance/time.Millisecond)
			must(t, req.AddGroupProtocolMetadata("range", &sarama.ConsumerGroupMemberMetadata{Version: 1, Topics: []string{topic}}))
			resp, err := b.JoinGroup(req)
			if err != nil {
				return nil, err
			}
			if !errors.Is(resp.Err, sarama.ErrMemberIdRequired) {
				return resp, nil
			}
			memberID = resp.MemberId
		}
	}
	sync := func(b *sarama.Broker, j *sarama.JoinGroupResponse) {
		req := &sarama.SyncGroupRequest{Version: 3, GroupId: group, GenerationId: j.GenerationId, MemberId: j.MemberId}
		if j.LeaderId == j.MemberId {
			for _, m := range j.Members { // every member gets nothing: the assignment does not matter here
				must(t, req.AddGroupAssignmentMember(m.MemberId, &sarama.ConsumerGroupMemberAssignment{Version: 1}))
			}
		}
		resp, err := b.SyncGroup(req)
		must(t, err)
		if !errors.Is(resp.Err, sarama.ErrNoError) {
			t.Fatalf("sync %s: %v", j.MemberId, resp.Err)
		}
	}
	heartbeat := func(b *sarama.Broker, gen int32, memberID string, stop <-chan struct{}) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(session / 4):
				}
				_, _ = b.Heartbeat(&sarama.HeartbeatRequest{Version: 3, GroupId: group, GenerationId: gen, MemberId: memberID})
			}
		}()
		return done
	}
	type answer struct {
		resp *sarama.JoinGroupResponse
		err  error
		took time.Duration
	}
	joinAsync := func(b *sarama.Broker, memberID string) <-chan answer {
		ch := make(chan answer, 1)
		start := time.Now()
		go func() {
			resp, err := join(b, memberID)
			ch <- answer{resp, err, time.Since(start)}
		}()
		return ch
	}

	// A alone, then A and B: a stable group of two, both heartbeating.
	a, bb, c := connect(), connect(), connect()
	ja, err := join(a, "")
	must(t, err)
	sync(a, ja)
	stopA := make(chan struct{})
	hbA := heartbeat(a, ja.GenerationId, ja.MemberId, stopA)
	jbCh := joinAsync(bb, "")
	time.Sleep(100 * time.Millisecond)
	close(stopA) // A rejoins for B's rebalance
	<-hbA
	jaCh := joinAsync(a, ja.MemberId)
	ra, rb := <-jaCh, <-jbCh
	if ra.err != nil || rb.err != nil {
		t.Fatalf("forming the group of two: %v, %v", ra.err, rb.err)
	}
	jb := rb.resp
	syncDone := make(chan struct{})
	go func() { defer close(syncDone); sync(bb, jb) }()
	sync(a, ra.resp)
	<-syncDone
	stopA, stopB := make(chan struct{}), make(chan struct{})
	defer close(stopB)
	hbA = heartbeat(a, ra.resp.GenerationId, ra.resp.MemberId, stopA)
	heartbeat(bb, jb.GenerationId, jb.MemberId, stopB) // B never rejoins
	time.Sleep(session)

	// C joins; A learns of it, stops heartbeating and rejoins at once, and
	// waits; B goes on heartbeating only.
	rebalanceStart := time.Now()
	cCh := joinAsync(c, "")
	time.Sleep(100 * time.Millisecond)
	close(stopA)
	<-hbA
	aCh := joinAsync(a, ra.resp.MemberId)
	rc := <-cCh
	if rc.err != nil {
		t.Fatalf("C's join: %v", rc.err)
	}
	t.Logf("C answered %v after the rebalance began (rebalance timeout %v)", time.Since(rebalanceStart).Round(10*time.Millisecond), rebalance)
	select {
	case r := <-aCh:
		// Kafka's behaviour: A is answered when the rebalance ends.
		t.Errorf("kfake answered A's join after %v (%v, err %v): it no longer drops the join of a member whose session ran out; revisit docs/kafka.md, \"A rebalance during an outage\", and kafkaReadTimeoutMargin", r.took.Round(10*time.Millisecond), r.resp, r.err)
	case <-time.After(rebalance):
		r := <-aCh
		t.Logf("A's join, sent with C's, was not answered: it ended after %v with %v (Net.ReadTimeout %v)", r.took.Round(10*time.Millisecond), r.err, readTimeout)
		if r.err == nil {
			t.Errorf("A's join was answered after %v: %+v", r.took, r.resp)
		}
	}
}
