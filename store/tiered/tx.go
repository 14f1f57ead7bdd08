package tiered

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
	"github.com/oncemill/oncemill/store/internal/wrappedtx"
)

// ClaimInTx implements store.Transactional: a finished record cached locally
// or in Redis is answered from there, without a transaction; everything
// else is the truth's claim, whose transaction the handler gets (for
// store/postgres, postgres.TxFromContext finds it as usual).
func (s *Store) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	if s.closed.Load() {
		return store.TxResult{}, closedErr("claim")
	}
	if err := requests.ValidateTx(req); err != nil {
		return store.TxResult{}, fmt.Errorf("oncemill: tiered: claim: %w", err)
	}
	k := id{req.Scope, req.Key}
	seq := s.seq.Load()
	if res, ok := s.lookup(ctx, k, req.Fingerprint, seq, opClaim); ok {
		return store.TxResult{ClaimResult: res}, nil
	}
	send := s.now()
	res, err := s.truth.ClaimInTx(ctx, req)
	if err != nil {
		return res, err
	}
	switch {
	case res.Decision == store.DecisionExecute && res.Tx != nil:
		t := &claimTx{s: s, id: k, fingerprint: req.Fingerprint, ttl: req.SuccessTTL, lease: res.Claim, claimed: send}
		t.Tx = wrappedtx.Tx{Tx: res.Tx, CommitFunc: t.commit}
		res.Tx = &t.Tx
	case finished(res.Record):
		s.tel.replayed(ctx, tierTruth)
		s.fillFromTruth(ctx, k, res.Record, seq, send, opClaim)
	}
	return res, nil
}

// RecordRollback implements store.Transactional: the truth, then a cached
// failure is written through to both caches (to expire out.TTL after the
// call was sent, less ClockMargin), and a retryable record takes the key
// out of them.
func (s *Store) RecordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) error {
	if s.closed.Load() {
		return closedErr("record rollback")
	}
	k := id{lease.Scope, lease.Key}
	seq := s.seq.Load()
	send := s.now()
	if err := s.truth.RecordRollback(ctx, lease, fingerprint, out); err != nil {
		return err
	}
	if out.Status != store.StatusCachedFailure || !plainText(string(out.ErrorKind), maxPlainKind) || !plainText(out.ErrorMessage, maxPlainMessage) {
		s.local.remove(k)
		s.redisForget(context.WithoutCancel(ctx), k, opRecordRollback)
		return nil
	}
	updated := s.truthTime(send)
	rec := store.Record{
		Scope: lease.Scope, Key: lease.Key, Fingerprint: fingerprint,
		Status: store.StatusCachedFailure, Token: lease.Token, Attempt: lease.Attempt,
		ErrorKind: out.ErrorKind, ErrorMessage: out.ErrorMessage,
		CreatedAt: updated, UpdatedAt: updated, ExpiresAt: updated.Add(out.TTL), MessageUUID: lease.MessageUUID,
	}
	s.fill(ctx, k, rec, after(send, out.TTL)-int64(s.opts.ClockMargin), seq, send, opRecordRollback)
	return nil
}

// claimTx is the truth's transaction, whose successful commit is written
// through to both caches. Its Context and Rollback are the truth's.
type claimTx struct {
	wrappedtx.Tx // the truth's, with commit as its Commit
	s            *Store
	id           id
	fingerprint  string
	ttl          time.Duration // the claim's SuccessTTL
	lease        store.Claim
	claimed      int64 // local time the claim was sent
}

// commit is the transaction's Commit. Only after the truth committed is the
// success cached, to expire SuccessTTL after the commit was sent (the
// truth replays it SuccessTTL from its commit, a moment after) less
// ClockMargin.
func (t *claimTx) commit(ctx context.Context, result []byte) error {
	s := t.s
	seq := s.seq.Load()
	send := s.now()
	if err := t.Tx.Tx.Commit(ctx, result); err != nil {
		return err
	}
	updated := s.truthTime(send)
	rec := store.Record{
		Scope: t.id.scope, Key: t.id.key, Fingerprint: t.fingerprint,
		Status: store.StatusSucceeded, Token: t.lease.Token, Attempt: t.lease.Attempt,
		Result:    bytes.Clone(result),
		CreatedAt: s.truthTime(t.claimed), UpdatedAt: updated, ExpiresAt: updated.Add(t.ttl), MessageUUID: t.lease.MessageUUID,
	}
	s.fill(ctx, t.id, rec, after(send, t.ttl)-int64(s.opts.ClockMargin), seq, send, opCommit)
	return nil
}
