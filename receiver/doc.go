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
// Build refuses configuration that cannot work, with a *oncemill.ConfigError
// that names the setting and says what to change. Everything not set keeps
// its default: the message UUID is the key, the handler name the scope, and
// the zero Policy's defaults apply.
//
// A handler needs nothing but this package: Permanent and Transient classify
// its errors, ClaimFromContext gives its fencing token, and Event and the
// Outcome constants describe what oncemill decided.
package receiver
