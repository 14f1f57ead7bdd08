package idempotency

import (
	"log/slog"
)

// The debug lines of a delivery's progress: "processing" before its handler
// runs, "stored" once its outcome is recorded. Each asks the logger first,
// so that a logger above debug level costs an executed delivery one Enabled
// call and nothing else; a replay never reaches them.

// processing logs, at debug level, that the delivery's handler is about to
// run under its claim.
func (s *idempotency) processing(d *delivery) {
	if s.logger.Enabled(d.msg.Context(), slog.LevelDebug) {
		s.logProcessing(d)
	}
}

//go:noinline
func (s *idempotency) logProcessing(d *delivery) {
	s.logger.LogAttrs(d.msg.Context(), slog.LevelDebug, "Processing: the handler runs under the claim", s.attrs(d)...)
}

// logStored logs, at debug level, the outcome recorded for the delivery and
// how long it is kept.
//
//go:noinline
func (s *idempotency) logStored(d *delivery) {
	ctx := d.msg.Context()
	if !s.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	s.logger.LogAttrs(ctx, slog.LevelDebug, "Stored: the outcome is recorded for its duplicates", s.attrs(d,
		slog.String("outcome", d.event.Outcome.String()),
		slog.String("ttl", d.stored.String()),
	)...)
}
