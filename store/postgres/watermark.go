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

// MoveWatermark sets the watermark of (group, topic, partition) to offset,
// creating the row if there is none, and returns the watermark it had
// (existed false when there was no row). Moving it back makes the offsets
// from offset on run again; moving it forward acks the skipped ones unrun.
// It is for operators: a topic recreated, a range to process again on
// purpose.
func (s *Store) MoveWatermark(ctx context.Context, group, topic string, partition int32, offset int64) (previous int64, existed bool, err error) {
	if group == "" || topic == "" || partition < 0 || offset < 0 {
		return 0, false, pgerr.Invalid("move watermark", "group %q, topic %q, partition %d, offset %d: give a group and a topic, and a partition and an offset of 0 or more", group, topic, partition, offset)
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
		}
		_, err = tx.Exec(ctx, q.Move, group, topic, partition, offset)
		return err
	})
	if err != nil {
		return 0, false, wrap("move watermark", err)
	}
	return previous, existed, nil
}
