// Package oncemilltest is a test kit for the handlers behind oncemill's
// receiver, as rivertest is for River's workers: it delivers a message the
// ways a broker really does (twice, at once, after a crash), duplicates
// messages inside a Watermill router, and asserts what came of it. Use it
// from _test.go files; its helpers take the test's testing.TB and fail it
// with t.Fatalf.
//
//	func TestChargeIsIdempotent(t *testing.T) {
//		var charges oncemilltest.Effects
//		charge := func(msg *message.Message) ([]*message.Message, error) {
//			charges.Add(msg.UUID) // where the real charge happens
//			return nil, nil
//		}
//		st, _ := memory.New(memory.Options{})
//		defer st.Close()
//
//		msg := message.NewMessage("pay-1", []byte(`{"amount":1200}`))
//		oncemilltest.DeliverTwice(t, receiver.New(st), charge, msg).
//			RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
//		charges.RequireCount(t, "pay-1", 1)
//	}
//
// # Deliveries
//
// DeliverTwice and DeliverConcurrently take the receiver's
// *receiver.Builder (over the store and with the policy the test wants),
// the handler as the router would call it (NoPublish adapts one that
// produces nothing), and the message. They build the receiver themselves,
// so that they can put an event handler of their own in it (a builder holds
// one, which they replace), and hand each delivery a copy of the message
// with its UUID, payload, metadata and context. What each delivery came to
// is a Delivery: oncemill's Event, what the receiver returned to the router
// (ack or nack, produced messages), and how many times the handler ran.
//
// The deliveries call the receiver directly, not through a router: there is
// no handler name, so the keys are scoped by the builder's WithScope, or the
// empty scope. The records live in the builder's store and outlast the
// helper: a fresh message UUID, or a fresh store, keeps tests apart.
//
// # Crashes
//
// In this kit a crash is a worker that dies after the handler's effect and
// before the delivery ended: oncemill never recorded the outcome and the
// broker never got the ack. DeliverAfterCrash plays it in the lease mode: the
// first delivery runs the handler, its Complete (or Release) fails as from a
// dead process, and once the lease has expired (on the store's manual
// clock, without waiting) the broker's redelivery takes the key over and
// runs the handler again. The lease mode cannot do better: the record and
// the effect are in different places. The test then shows whether the
// effect itself is idempotent (a unique key, an upsert, the lease's fencing
// token passed on to the system written to).
//
// Unlike its siblings it takes a builder constructor, newBuilder, not a
// builder: the crash needs a store the helper controls (one that fails the
// crashed worker's writes, on a clock it moves past the lease), and a
// receiver.Builder does not give out its store. newBuilder builds over the
// store it is given: receiver.New(st) with the test's policy and options.
//
// It does not cover a worker frozen past its lease (a GC pause, a stopped
// VM) that wakes and acts late, while a redelivery has taken the key over:
// hold the handler of one delivery, move a storetest.Clock past the lease,
// deliver again, and let the first go on; pipeline.CheckLease right before
// the effect is what keeps it from acting twice. Nor a crash after the
// outcome was recorded: that is a plain duplicate (DeliverTwice).
//
// In the one-transaction mode (receiver.NewTransactional over
// store/postgres) a crash before the commit rolls back the handler's writes
// with the claim, and the redelivery executes on a clean slate. A test plays
// it against a real PostgreSQL by ending the handler's connection, the way
// a dead worker's ends:
//
//	crashed := false
//	ds := oncemilltest.DeliverTwice(t, receiver.NewTransactional(st), func(msg *message.Message) ([]*message.Message, error) {
//		tx, _ := postgres.TxFromContext(msg.Context())
//		if _, err := tx.Exec(msg.Context(), `INSERT INTO payments (id) VALUES ($1)`, msg.UUID); err != nil {
//			return nil, err
//		}
//		if !crashed { // the first worker dies before its commit
//			crashed = true
//			_, err := tx.Exec(msg.Context(), `SELECT pg_terminate_backend(pg_backend_pid())`)
//			return nil, err
//		}
//		return nil, nil
//	}, msg)
//	ds.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeExecuted)
//	// and SELECT count(*) FROM payments WHERE id = msg.UUID is 1
//
// # Integration tests
//
// DuplicatingMiddleware makes a router handle every message several times,
// through the receiver, so an end-to-end test sees real duplicates; Effects
// then checks that each message took effect once (RequireEachOnce).
package oncemilltest
