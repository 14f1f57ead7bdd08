// Package storetest is the contract suite every store.Store passes.
//
// A store's own test hands Run a function that builds a Harness: the store
// under test and a way to move the store's clock forward. Run then checks the
// whole contract of package store, one subtest per rule:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			clock := storetest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
//			s, err := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { s.Close() })
//			return storetest.Harness{Store: s, Advance: clock.Advance}
//		})
//	}
//
// Stores judged by a server clock (PostgreSQL now(), Redis's TTLs) cannot be
// handed a fake clock; their Advance moves every stored deadline earlier by
// d instead, which the suite cannot tell apart from time passing. A store
// that frees expired records by itself sets Harness.NativeExpiry.
//
// Run checks what a store has beyond store.Store and store.Admin, found on
// Harness.Store: a DeleteExpired(ctx, limit) (int, error) method (the
// DeleteExpired subtest) and store.Transactional (the one-transaction
// mode's contract, under Transactional/, reading records back with the
// store's Get). A store without one of them skips that subtest, saying so.
//
// newHarness is called once per subtest, and once for the Transactional
// group itself, to see whether the store has that mode. The store behind it may be shared
// between subtests (a real database): every subtest uses its own random
// scope, so records of different subtests and different runs never meet.
// The suite runs its subtests one after another, because Advance moves time
// for everything in the store; a harness whose subtests each get a store of
// their own (their own clock, their own key prefix) may call t.Parallel at
// its start, and the memory and Redis suites do. Turn off any background cleanup of the
// store under test: the suite checks that an expired lease is taken over with
// attempt n+1, which a sweep in between would turn into attempt 1.
//
// Rules the suite pins down beyond the comments in package store:
//
//   - A record is visible (Get, Replay, Held) while the store's clock is
//     before its ExpiresAt. An in-progress record whose lease has expired is
//     hidden from Get but still counts attempts: the next ClaimLease takes it over
//     with attempt n+1 until the claim's LeaseRequest.Retain has passed;
//     once cleanup (DeleteExpired, or the store's own expiry) has removed
//     it, the next ClaimLease starts again at attempt 1.
//   - The fingerprint is checked against every record whose state the new
//     delivery would carry on: live records and in-progress records being
//     taken over. An empty fingerprint on either side skips the check.
//   - Release with keep <= 0 removes the record (the key is absent again).
//   - Extend with d <= 0 and DeleteExpired with limit <= 0 are invalid
//     requests.
//   - Delete removes a record only under the token it was read with
//     (store.ErrLeaseLost after a takeover, store.ErrNotFound when absent).
//   - Fencing tokens of one (scope, key) strictly increase across Release,
//     takeover, expiry and Delete.
//   - Result bytes are copied in and out: changing the slice given to Complete
//     or the one returned by ClaimLease or Get does not change the stored result.
package storetest
