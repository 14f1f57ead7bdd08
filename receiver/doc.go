// Package receiver is oncemill's front door: a fluent builder that assembles
// the pipeline around a store and hands back a Watermill middleware.
//
//	st, _ := memory.New(memory.Options{})
//	r, err := receiver.New(st).
//		WithPolicy(policy.Policy{SuccessTTL: 7 * 24 * time.Hour}).
//		Build()
//	if err != nil { ... }
//	router.AddMiddleware(r.Middleware)
//
// The builder is the one way to assemble the pipeline: validation →
// idempotency → retry → circuit breaker → transaction → handler, in that
// order. Build refuses configuration that cannot work, or that has no
// effect in the chosen mode, with a *oncemill.ConfigError that names the
// builder method the value came from and says what to change. Everything
// not set keeps its default: the message UUID is the key, the handler name
// the scope, and the zero policy.Policy's defaults apply.
//
// Each name has one home: a handler classifies its errors with
// policy.Cached and policy.Retryable, reads its fencing token with
// pipeline.ClaimFromContext, and pipeline.Event and the pipeline.Outcome
// constants describe what oncemill decided.
package receiver
