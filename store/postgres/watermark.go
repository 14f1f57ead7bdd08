package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
	"github.com/oncemill/oncemill/store/postgres/internal/watermark"
)

// The watermark mode on Kafka (store.KafkaWatermarks): one row per
// (group, topic, partition) in <Table>_watermarks, holding the next offset
// to process (internal/watermark); and its rows for operators.

// errWatermarkConfig: the watermark mode was asked for without a consumer
// group, or without the high-water mark it checks a watermark against.
var errWatermarkConfig = fmt.Errorf("oncemill: postgres: kafka watermarks: %w", store.ErrInvalidRequest)

// KafkaWatermarks implements store.KafkaWatermarks: the one-transaction
// claims of the watermark mode for the consumer group group, on the table
// <Table>_watermarks that Migrate creates. Use it through
// receiver.NewTransactional(st).WithKafkaWatermark, which builds it.
func (s *Store) KafkaWatermarks(group string, highWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)) (store.Transactional, error) {
	switch {
	case group == "":
		return nil, fmt.Errorf("%w: the consumer group is empty; the watermarks follow a group's progress: pass the subscriber's ConsumerGroup", errWatermarkConfig)
	case highWaterMark == nil:
		return nil, fmt.Errorf("%w: HighWaterMark is nil; pass a function that asks Kafka for a partition's high-water mark (kafkakeys.HighWaterMark)", errWatermarkConfig)
	}
	if err := pgerr.CheckText("kafka watermarks", "group", group); err != nil {
		return nil, err
	}
	return watermark.New(watermark.Config{
		Pool: s.pool, Gate: &s.gate, SQL: s.watermarkStatements(), TxOptions: s.opts.TxOptions, Limits: s.Limits(),
		Group: group, HighWaterMark: highWaterMark,
	}), nil
}

// watermarkStatements are the mode's statements with the store's names.
func (s *Store) watermarkStatements() watermark.Statements {
	return watermark.NewStatements(s.names.render)
}

// Watermark is one partition's row of the watermark mode, for operators
// (Store.Watermarks, "oncemill watermark show").
type Watermark struct {
	Group     string
	Topic     string
	Partition int32
	// Next is the watermark: the next offset to process. Lower offsets are
	// acked as duplicates.
	Next int64
	// LastOffset is the last offset that committed or cached a failure
	// (-1: none yet), LastStatus its outcome, LastMessageUUID its message.
	LastOffset      int64
	LastStatus      store.Status
	LastErrorKind   store.ErrorKind
	LastMessageUUID string
	// Attempts counts the failed attempts of AttemptOffset.
	AttemptOffset int64
	Attempts      int
	UpdatedAt     time.Time
}

// Watermarks returns the watermark mode's rows, those of group and topic
// when not empty, ordered by group, topic and partition.
func (s *Store) Watermarks(ctx context.Context, group, topic string) ([]Watermark, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "watermarks", 0)
	if err != nil {
		return nil, err
	}
	defer s.gate.Leave(cancel)
	rows, err := s.pool.Query(ctx, s.watermarkStatements().List, group, topic)
	if err != nil {
		return nil, wrap("watermarks", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Watermark, error) {
		var w Watermark
		var status int16
		var kind string
		var attempts int32
		err := row.Scan(&w.Group, &w.Topic, &w.Partition, &w.Next, &w.LastOffset, &status, &w.LastMessageUUID, &kind, &w.AttemptOffset, &attempts, &w.UpdatedAt)
		w.LastStatus, w.LastErrorKind, w.Attempts = store.Status(status), store.ErrorKind(kind), int(attempts)
		return w, err
	})
	if err != nil {
		return nil, wrap("watermarks", err)
	}
	return out, nil
}

// MoveWatermark sets the watermark of (group, topic, partition) to offset
// and returns the watermark it had. A partition without a row is refused
// with store.ErrNotFound, since a mistyped group or topic would otherwise
// get a row of its own, unless create, which creates the row (existed is
// then false). Moving it back makes the offsets from offset on run again;
// moving it forward acks the skipped ones unrun. It is for operators: a
// topic recreated, a range to process again on purpose.
func (s *Store) MoveWatermark(ctx context.Context, group, topic string, partition int32, offset int64, create bool) (previous int64, existed bool, err error) {
	if err := checkWatermarkID("move watermark", group, topic, partition); err != nil {
		return 0, false, err
	}
	if offset < 0 {
		return 0, false, pgerr.Invalid("move watermark", "offset %d: give an offset of 0 or more", offset)
	}
	ctx, cancel, err := s.gate.Enter(ctx, "move watermark", 0)
	if err != nil {
		return 0, false, err
	}
	defer s.gate.Leave(cancel)
	q := s.watermarkStatements()
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, q.Lock, group, topic, partition).Scan(&previous)
		switch {
		case err == nil:
			existed = true
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		case !create:
			return nil // nothing to change: the transaction ends empty
		}
		_, err = tx.Exec(ctx, q.Move, group, topic, partition, offset)
		return err
	})
	switch {
	case err != nil:
		return 0, false, wrap("move watermark", err)
	case !existed && !create:
		return 0, false, noWatermark("move watermark", group, topic, partition)
	}
	return previous, existed, nil
}

// DeleteWatermark removes the row of (group, topic, partition) and returns
// the watermark it had; store.ErrNotFound when there is none. The
// partition's next claim creates its row again at the offset it claims:
// the partition starts over from where the group's Kafka offset stands,
// with nothing below it acked as a duplicate. It is for operators: a row
// of a group or topic that no longer exists.
func (s *Store) DeleteWatermark(ctx context.Context, group, topic string, partition int32) (previous int64, err error) {
	if err := checkWatermarkID("delete watermark", group, topic, partition); err != nil {
		return 0, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "delete watermark", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	err = s.pool.QueryRow(ctx, s.watermarkStatements().Delete, group, topic, partition).Scan(&previous)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, noWatermark("delete watermark", group, topic, partition)
	}
	if err != nil {
		return 0, wrap("delete watermark", err)
	}
	return previous, nil
}

// checkWatermarkID refuses what names no partition's row.
func checkWatermarkID(op, group, topic string, partition int32) error {
	if group == "" || topic == "" || partition < 0 {
		return pgerr.Invalid(op, "group %q, topic %q, partition %d: give a group, a topic and a partition of 0 or more", group, topic, partition)
	}
	return nil
}

// noWatermark is the error of a partition without a row.
func noWatermark(op, group, topic string, partition int32) error {
	return fmt.Errorf("oncemill: postgres: %s: group %q topic %q partition %d has no watermark: %w", op, group, topic, partition, store.ErrNotFound)
}
