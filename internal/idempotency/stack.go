package idempotency

// Watermill's router runs every message on a goroutine of its own, which
// starts with a small stack (usually 2 KB). The stage's path to the store
// needs about 3 KB, so the stack grows once per message, and the runtime
// copies it, adjusting every frame on it: deep in the store call, with a
// dozen frames to move, that copy cost about as much as the stage's own
// work. growStack makes the growth happen at the stage's entry instead,
// where only the router's frames are on the stack.

// stackReserve is more than a 2 KB stack has left at the stage's entry, so
// that it grows there, and less than the 4 KB it doubles to has, so that it
// grows once: the stage's common paths (ClaimLease and Complete through the
// memory store) fit in 4 KB.
const stackReserve = 2560

// growStack's frame is stackReserve bytes: calling it grows a smaller
// stack now, and costs the clearing of its array when the stack is large
// enough already.
//
//go:noinline
func growStack(i int) byte {
	var pad [stackReserve]byte
	return pad[i%stackReserve] // read, so that the compiler keeps the frame
}
