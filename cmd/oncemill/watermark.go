package main

// The watermark mode's rows (PostgreSQL): one per (consumer group, topic,
// partition), holding the next offset to process (docs/kafka.md).

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

type watermarkCmd struct {
	Show   watermarkShowCmd   `cmd:"" help:"List the Kafka watermarks (--store=postgres): per consumer group, topic and partition, the next offset to process, the last committed offset and its outcome."`
	Move   watermarkMoveCmd   `cmd:"" help:"Set a partition's watermark (--store=postgres), to process a range again (move back) or skip one (move forward), or after a topic was recreated. Needs --force, and --create for a partition without a row; writes an audit line to stderr."`
	Delete watermarkDeleteCmd `cmd:"" help:"Delete a partition's watermark row (--store=postgres): one of a group or topic that no longer exists, or a mistyped one. Needs --force; writes an audit line to stderr."`
}

type watermarkShowCmd struct {
	Group string `help:"Only this consumer group."`
	Topic string `help:"Only this topic."`
}

// watermarkID names one partition's row, for move and delete.
type watermarkID struct {
	Group     string `required:"" help:"The consumer group."`
	Topic     string `required:"" help:"The topic."`
	Partition int32  `required:"" help:"The partition."`
}

func (w watermarkID) String() string {
	return fmt.Sprintf("group %s topic %s partition %d", w.Group, w.Topic, w.Partition)
}

// attrs are the audit line's attributes of the row.
func (w watermarkID) attrs() []any {
	return []any{slog.String("group", w.Group), slog.String("topic", w.Topic), slog.Int("partition", int(w.Partition))}
}

type watermarkMoveCmd struct {
	watermarkID
	Offset int64 `required:"" help:"The new watermark: the next offset to process. Lower offsets are acked unrun as duplicates; this one and later ones run."`
	Force  bool  `help:"Move it. Without --force nothing changes: moving back runs offsets a second time, moving forward acks offsets that never ran."`
	Create bool  `help:"Create the row if the partition has none (its first offsets below --offset are then acked unrun). Without it a partition without a row is refused, so that a mistyped group or topic gets no row."`
}

type watermarkDeleteCmd struct {
	watermarkID
	Force bool `help:"Delete it. Without --force nothing changes: the partition's next message then starts the row again, and every offset from the group's Kafka offset on runs, duplicates of processed ones included."`
}

// watermarkView is one row as the commands print it.
type watermarkView struct {
	Group           string    `json:"group"`
	Topic           string    `json:"topic"`
	Partition       int32     `json:"partition"`
	Next            int64     `json:"next_offset"`
	LastOffset      int64     `json:"last_offset"`
	LastStatus      string    `json:"last_status"`
	LastErrorKind   string    `json:"last_error_kind,omitempty"`
	LastMessageUUID string    `json:"last_message_uuid,omitempty"`
	AttemptOffset   int64     `json:"attempt_offset"`
	Attempts        int       `json:"attempts"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// watermarkStore opens the PostgreSQL store and checks that it has the
// watermark table (schema version 4 or later).
func (a *app) watermarkStore(f func(st *postgres.Store) error) error {
	if a.g.Store != "postgres" {
		return usage("--store=%s: the Kafka watermarks live in PostgreSQL only; use --store=postgres", a.g.Store)
	}
	b, st, err := openPostgres(a.ctx, a.g)
	if err != nil {
		return err
	}
	defer b.close()
	if err := b.ready(a.ctx); err != nil {
		return err
	}
	if v, err := st.AppliedVersion(a.ctx); err != nil {
		return err
	} else if v < 4 {
		return notFound("%s is at schema version %d, without the watermark table: run \"oncemill migrate\"", b.where, v)
	}
	return f(st)
}

func (c *watermarkShowCmd) Run(a *app) error {
	return a.watermarkStore(func(st *postgres.Store) error {
		ws, err := st.Watermarks(a.ctx, c.Group, c.Topic)
		if err != nil {
			return err
		}
		if a.g.JSON {
			for _, w := range ws {
				if err := writeJSON(a.stdout, viewOfWatermark(w)); err != nil {
					return err
				}
			}
			return nil
		}
		if len(ws) == 0 {
			_, err := fmt.Fprintln(a.stdout, "no watermarks")
			return err
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tNEXT OFFSET\tLAST OFFSET\tLAST OUTCOME\tATTEMPTS\tUPDATED")
		for _, w := range ws {
			last, attempts := "-", "-"
			if w.LastOffset >= 0 {
				last = strconv.FormatInt(w.LastOffset, 10)
			}
			if w.Attempts > 0 && w.AttemptOffset >= w.Next {
				attempts = fmt.Sprintf("%d of offset %d", w.Attempts, w.AttemptOffset)
			}
			outcome := w.LastStatus.String()
			if w.LastErrorKind != "" {
				outcome += " (" + string(w.LastErrorKind) + ")"
			}
			if w.LastOffset < 0 {
				outcome = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", w.Group, w.Topic, w.Partition, w.Next, last, outcome, attempts, w.UpdatedAt.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

func viewOfWatermark(w postgres.Watermark) watermarkView {
	return watermarkView{
		Group: w.Group, Topic: w.Topic, Partition: w.Partition, Next: w.Next, LastOffset: w.LastOffset,
		LastStatus: w.LastStatus.String(), LastErrorKind: string(w.LastErrorKind), LastMessageUUID: w.LastMessageUUID,
		AttemptOffset: w.AttemptOffset, Attempts: w.Attempts, UpdatedAt: w.UpdatedAt,
	}
}

// moveView is what move prints.
type moveView struct {
	Action    string `json:"action"` // "moved"
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      *int64 `json:"from_offset"` // null: the partition had no row
	To        int64  `json:"to_offset"`
}

func (c *watermarkMoveCmd) Run(a *app) error {
	if c.Partition < 0 || c.Offset < 0 {
		return usage("--partition=%d --offset=%d: both must be 0 or more", c.Partition, c.Offset)
	}
	if !c.Force {
		return refused("not moved: moving the watermark of %s to %d changes what runs: offsets below it are acked unrun, "+
			"offsets from it on run (again, if they ran). Stop the group's consumers first, check with \"oncemill watermark show\", then add --force",
			c.watermarkID, c.Offset)
	}
	return a.watermarkStore(func(st *postgres.Store) error {
		prev, existed, err := st.MoveWatermark(a.ctx, c.Group, c.Topic, c.Partition, c.Offset, c.Create)
		if errors.Is(err, store.ErrNotFound) {
			return notFound("not moved: %s has no watermark row: check the names with \"oncemill watermark show\", "+
				"or add --create to create the row", c.watermarkID)
		}
		if err != nil {
			return err
		}
		from := "none"
		out := moveView{Action: "moved", Group: c.Group, Topic: c.Topic, Partition: c.Partition, To: c.Offset}
		if existed {
			from = strconv.FormatInt(prev, 10)
			out.From = &prev
		}
		audit(a, "audit: Kafka watermark moved", append(c.attrs(), slog.String("from_offset", from), slog.Int64("to_offset", c.Offset))...)
		if a.g.JSON {
			return writeJSON(a.stdout, out)
		}
		_, err = fmt.Fprintf(a.stdout, "moved the watermark of %s from %s to %d\n", c.watermarkID, from, c.Offset)
		return err
	})
}

// deleteView is what delete prints.
type deleteView struct {
	Action    string `json:"action"` // "deleted"
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      int64  `json:"from_offset"`
}

func (c *watermarkDeleteCmd) Run(a *app) error {
	if c.Partition < 0 {
		return usage("--partition=%d: must be 0 or more", c.Partition)
	}
	if !c.Force {
		return refused("not deleted: without its row, the next message of %s starts the row again, and every offset from the group's Kafka offset on runs, "+
			"even one processed before. Stop the group's consumers first, check with \"oncemill watermark show\", then add --force", c.watermarkID)
	}
	return a.watermarkStore(func(st *postgres.Store) error {
		prev, err := st.DeleteWatermark(a.ctx, c.Group, c.Topic, c.Partition)
		if errors.Is(err, store.ErrNotFound) {
			return notFound("not deleted: %s has no watermark row: check the names with \"oncemill watermark show\"", c.watermarkID)
		}
		if err != nil {
			return err
		}
		audit(a, "audit: Kafka watermark deleted", append(c.attrs(), slog.Int64("from_offset", prev))...)
		if a.g.JSON {
			return writeJSON(a.stdout, deleteView{Action: "deleted", Group: c.Group, Topic: c.Topic, Partition: c.Partition, From: prev})
		}
		_, err = fmt.Fprintf(a.stdout, "deleted the watermark of %s (it was %d)\n", c.watermarkID, prev)
		return err
	})
}

// audit writes the audit line of a change: who changed what, from where
// to where, on stderr, which an operator's session or job log keeps.
func audit(a *app, msg string, attrs ...any) {
	slog.New(slog.NewTextHandler(a.stderr, nil)).Warn(msg, append(attrs, slog.String("user", operator()))...)
}

// operator names who runs the command, for the audit line: $USER, else the
// process's OS account, since a cron job or a container may set no $USER.
func operator() string {
	if name := os.Getenv("USER"); name != "" {
		return name
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "uid " + strconv.Itoa(os.Getuid())
}
