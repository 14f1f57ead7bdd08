// Package receiver is oncemill's front door: a fluent builder that assembles
// the pipeline around a store and hands back a Watermill middleware or a
// wrapped handler.
//
//	st, _ := memory.New(memory.Options{})
//	r, err := receiver.New(st).
//		WithKeyGenerator(keygen.UUID()).
//		WithSuccessTTL(24 * time.Hour).
//		Build()
//	if err != nil { ... }
//	router.AddMiddleware(r.Middleware)
//
// Build refuses configuration that cannot work and says what to change.
// Everything not set keeps the defaults of policy.Default.
package receiver
