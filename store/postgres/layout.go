package postgres

import "time"

// Layout is how a Store lays out its records table: Options.Layout.
type Layout int

const (
	// LayoutDelete is one plain table, whose expired rows the background
	// cleaner removes in bounded DELETE batches walking a purge_at index.
	// The default.
	LayoutDelete Layout = iota
	// LayoutPartitioned is a table partitioned by claim time, whose
	// partitions the background cleaner drops whole once every row in them
	// is past its purge time: no DELETE, no purge_at index. Its role
	// creates and drops partitions as it runs. Migrate
	// converts a table of the DELETE layout online, by attaching it as the
	// first partition.
	LayoutPartitioned
)

// Bounds of the partition width (partitionWidth).
const (
	minPartitionWidth = time.Minute
	maxPartitionWidth = 24 * time.Hour
	// partitionsPerRetention is how many partitions one retention spans.
	partitionsPerRetention = 24
)

// partitionWidth is the time range of one partition: a 24th of the
// retention, in whole minutes, from 1 minute to 1 day. A partition is
// dropped once its newest row is past its purge time, so a row outlives its
// purge time by at most about one width (4% of the retention), while a key's
// lookup probes the primary key index of each live partition (about 26):
// 24 keeps both small. The bounds keep the DDL rare (a partition a minute
// at most) and the count of partitions of a long retention near 24 (a
// month is 31 one-day partitions).
func partitionWidth(retention time.Duration) time.Duration {
	w := (retention / partitionsPerRetention).Truncate(time.Minute)
	return min(max(w, minPartitionWidth), maxPartitionWidth)
}
