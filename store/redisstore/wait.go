package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/configerr"
)

// ErrNotReplicated is the error of a write that fewer replicas than
// Options.WaitReplicas acknowledged within Options.WaitTimeout. The write is
// on the primary, but a failover may still lose it, so the call fails: the
// lease mode nacks the delivery (a claim) or tries the write again while
// the lease is held (a completion), as for any store failure.
var ErrNotReplicated = errors.New("fewer replicas than WaitReplicas acknowledged the write")

// defaultWaitTimeout is Options.WaitTimeout's default: below go-redis's
// default ReadTimeout of 3s, which must outlast WAIT's reply.
const defaultWaitTimeout = time.Second

// waitDefaults checks Options.WaitReplicas and WaitTimeout for client.
func (o Options) waitDefaults(client redis.UniversalClient) (Options, error) {
	switch {
	case o.WaitReplicas < 0:
		return o, configerr.New("redis.Options.WaitReplicas", "%d is negative; use the number of replicas that must acknowledge each write, or 0 for no WAIT", o.WaitReplicas)
	case o.WaitTimeout < 0:
		return o, configerr.New("redis.Options.WaitTimeout", "%v is negative; use a positive bound such as 1s, or 0 for the default %v", o.WaitTimeout, defaultWaitTimeout)
	case o.WaitReplicas == 0 && o.WaitTimeout > 0:
		return o, configerr.New("redis.Options.WaitTimeout", "is %v but WaitReplicas is 0, so nothing waits; set WaitReplicas, or leave WaitTimeout 0", o.WaitTimeout)
	case o.WaitReplicas == 0:
		return o, nil
	case o.WaitTimeout == 0:
		o.WaitTimeout = defaultWaitTimeout
	case o.WaitTimeout < time.Millisecond:
		// WAIT counts in whole milliseconds, and its 0 waits forever.
		return o, configerr.New("redis.Options.WaitTimeout", "%v is below WAIT's 1ms resolution; use 1ms or more", o.WaitTimeout)
	}
	if o.AutoPipeline {
		// WAIT blocks its connection until the replicas answer; on the
		// AutoPipeliner's shared connection it would stall every caller.
		return o, configerr.New("redis.Options.WaitReplicas", "cannot be used with AutoPipeline (WAIT would hold the shared connection for up to WaitTimeout); turn AutoPipeline off")
	}
	var rt time.Duration
	switch c := client.(type) {
	case *redis.Client:
		rt = c.Options().ReadTimeout
	case *redis.ClusterClient:
		rt = c.Options().ReadTimeout
	default:
		// A Ring spreads keys over shards that it alone knows; WAIT must
		// reach the shard that took the write, on the same connection.
		return o, configerr.New("redis.Options.WaitReplicas", "needs a *redis.Client (redis.NewClient, redis.NewFailoverClient) or *redis.ClusterClient, not %T; set WaitReplicas 0 for it", client)
	}
	if rt > 0 && o.WaitTimeout >= rt {
		return o, configerr.New("redis.Options.WaitTimeout", "%v is not below the client's ReadTimeout %v, which would cut WAIT's reply off; lower WaitTimeout or raise ReadTimeout", o.WaitTimeout, rt)
	}
	return o, nil
}

// primary is the client that reaches key's primary: the client itself, or
// on a cluster the master of key's slot, so that a pipeline on it is one
// connection and WAIT follows the write it waits for.
func (s *Store) primary(ctx context.Context, key string) (*redis.Client, error) {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		return c.MasterForKey(ctx, key)
	}
	return s.client.(*redis.Client), nil
}

// process sends cmd. With Options.WaitReplicas it sends cmd and WAIT in one
// round trip on one connection of key's primary, and returns what WAIT's
// answer means for cmd's write: nil when enough replicas acknowledged it,
// otherwise an error wrapping ErrNotReplicated (or WAIT's own error). The
// caller decides from cmd whether it wrote, and so whether that counts.
func (s *Store) process(ctx context.Context, c commander, key string, cmd redis.Cmder) (acked error) {
	if s.waitReplicas == 0 {
		_ = c.Process(ctx, cmd)
		return nil
	}
	node, err := s.primary(ctx, key)
	if err != nil {
		cmd.SetErr(err)
		return err
	}
	// A pipeline reads its replies within the client's ReadTimeout, which
	// New checked WaitTimeout against.
	wait := redis.NewIntCmd(ctx, "wait", s.waitReplicas, s.waitTimeout.Milliseconds())
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		_ = p.Process(ctx, cmd)
		_ = p.Process(ctx, wait)
		return nil
	})
	if c, ok := s.client.(*redis.ClusterClient); ok && isMoved(cmd.Err()) {
		// The node pipeline bypassed the cluster client, which would have
		// followed the redirection and learned the new slot map: this
		// call fails (a store failure, retried), the next finds the slot.
		c.ReloadState(ctx)
	}
	n, err := wait.Result()
	switch {
	case err != nil:
		return fmt.Errorf("WAIT %d %d: %w", s.waitReplicas, s.waitTimeout.Milliseconds(), err)
	case n < int64(s.waitReplicas):
		return fmt.Errorf("%d of %d replicas acknowledged the write within %v: %w", n, s.waitReplicas, s.waitTimeout, ErrNotReplicated)
	}
	return nil
}

// isMoved reports a cluster's redirection of a key to another node.
func isMoved(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "MOVED ") || strings.HasPrefix(err.Error(), "ASK "))
}

// eval runs script on key with process: EVALSHA, loading the script first
// when the server does not have it (a restarted or newly promoted primary
// has no scripts cached). script.Run cannot do that inside a pipeline,
// whose replies come after it returns.
func (s *Store) eval(ctx context.Context, c commander, script *redis.Script, key string, args ...any) (*redis.Cmd, error) {
	cmd := redis.NewCmd(ctx, append([]any{"evalsha", script.Hash(), 1, key}, args...)...)
	acked := s.process(ctx, c, key, cmd)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		if err := script.Load(ctx, c).Err(); err != nil {
			cmd.SetErr(err)
			return cmd, err
		}
		cmd = redis.NewCmd(ctx, append([]any{"evalsha", script.Hash(), 1, key}, args...)...)
		acked = s.process(ctx, c, key, cmd)
	}
	return cmd, acked
}

// runWritten is run for the scripts that write: with
// Options.WaitReplicas, each is followed by WAIT (process).
func (s *Store) runWritten(ctx context.Context, script *redis.Script, key string, args ...any) (*redis.Cmd, error) {
	if s.waitReplicas == 0 {
		return s.run(ctx, script, key, args...), nil
	}
	cmd, acked := s.eval(ctx, s.client, script, key, args...)
	if isWrongType(cmd.Err()) && migrate(ctx, s.client, key) == nil {
		cmd, acked = s.eval(ctx, s.client, script, key, args...)
	}
	return cmd, acked
}

// abandon ends the lease a claim wrote but could not get acknowledged, so
// that the redelivery of the same message is not held back by it: a new
// record (wasNew) is removed, a takeover's record is left as an expired
// lease for its tail (tail ms), which the next claim takes over at once.
// Best effort: if the primary is gone, the lease runs out by itself.
func (s *Store) abandon(ctx context.Context, key string, value []byte, wasNew bool, tail time.Duration) {
	keep := int64(0)
	if !wasNew {
		keep = max(tail.Milliseconds(), 1)
	}
	_ = abandonScript.Run(ctx, s.client, []string{key}, value, keep).Err()
}

// abandonTimeout bounds the giving back of a lease (claimFailed).
const abandonTimeout = time.Second

// claimFailed is the error of a claim whose write was not acknowledged by
// enough replicas: its lease is abandoned first.
func (s *Store) claimFailed(ctx context.Context, key string, value []byte, wasNew bool, tail time.Duration, acked error) error {
	// Not the caller's context, which may have ended with the WAIT; a
	// bound of its own, as the primary may be gone.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	s.abandon(actx, key, value, wasNew, tail)
	return fmt.Errorf("the lease is given back: %w", acked)
}
