package main

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/oncemill/oncemill/internal/result"
	"github.com/oncemill/oncemill/store"
)

// recordID names one record by flags, as every command names what it
// works on: --scope and --key here, --scope alone to filter list, stats and
// purge, --group, --topic and --partition for a watermark. Flags rather
// than positional arguments, so that an optional one (a scope for --uuid)
// and a key that starts with a dash (--key=-k) need no rule of their own.
type recordID struct {
	Scope string `placeholder:"SCOPE" help:"The record's scope: the Watermill handler's name unless the receiver sets one (WithScope)."`
	Key   string `placeholder:"KEY" help:"The record's key; one that starts with a dash as --key=-k."`
}

// validate requires both flags.
func (r recordID) validate() error {
	switch {
	case r.Scope == "" && r.Key == "":
		return errors.New("missing flags --scope=SCOPE --key=KEY: name the record, e.g. --scope=payments --key=order-42")
	case r.Scope == "":
		return errors.New("missing flag --scope=SCOPE: a key is looked up in its scope (the Watermill handler's name unless the receiver sets one)")
	case r.Key == "":
		return errors.New("missing flag --key=KEY")
	}
	return nil
}

type inspectCmd struct {
	recordID
	UUID     string `name:"uuid" placeholder:"UUID" help:"Instead of --key: the records whose key the message of this UUID claimed last (a dead-lettered message's, say), whatever the key is, expired ones included; with --scope, in that scope only. No store indexes the UUID: PostgreSQL reads the whole table (or the scope's rows), Redis SCANs every key of the prefix; an operator's lookup, not for scripts in a loop."`
	Messages bool   `help:"Also print the produced messages stored with a success (or the raw bytes, when they do not decode)."`
}

func (c *inspectCmd) Validate() error {
	switch {
	case c.UUID != "" && c.Key != "":
		return errors.New("pass either --scope and --key, or --uuid (with an optional --scope), not both")
	case c.UUID == "" && c.Key == "":
		return errors.New("missing flag --key=KEY (with --scope=SCOPE), or --uuid=UUID")
	case c.UUID == "":
		return c.recordID.validate()
	}
	return nil
}

// inspectView is what inspect prints: the record, and with --messages its
// stored result.
type inspectView struct {
	recordView
	Now          time.Time      `json:"now"`
	Messages     []producedView `json:"messages,omitempty"`
	Omitted      bool           `json:"messages_omitted,omitempty"`
	ResultBase64 *string        `json:"result_base64,omitempty"`
}

// producedView is one produced message as the pipeline stored it.
type producedView struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  string            `json:"payload"`
}

// maxDumpBytes bounds the hex dump of a result in the table.
const maxDumpBytes = 4096

func (c *inspectCmd) Run(a *app) error {
	if c.UUID != "" {
		return c.runUUID(a)
	}
	return a.withStore(func(b *backend) error {
		rec, err := b.admin.Get(a.ctx, c.Scope, c.Key)
		if errors.Is(err, store.ErrNotFound) {
			return notFound("no live record for %s: it is absent or expired (an expired lease is taken over by the next delivery)", id(c.Scope, c.Key))
		}
		if err != nil {
			return b.readFailed(err)
		}
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		if a.g.JSON {
			return writeJSONIndented(a.stdout, c.view(rec, now))
		}
		return c.print(a, rec, now)
	})
}

// runUUID prints every record the message UUID claimed last: one, unless
// the message was delivered to several handlers (scopes), or its key was
// claimed again by it after another key's record expired. With --json, one
// JSON object a line.
func (c *inspectCmd) runUUID(a *app) error {
	return a.withStore(func(b *backend) error {
		now, err := b.storeNow(a.ctx)
		if err != nil {
			return err
		}
		req := store.ListRequest{Scope: c.Scope, MessageUUID: c.UUID}
		n := 0
		for page, err := range b.pages(a.ctx, req) {
			if err != nil {
				return err
			}
			for _, rec := range page.Records {
				if a.g.JSON {
					err = writeJSON(a.stdout, c.view(rec, now))
				} else {
					if n > 0 {
						fmt.Fprintln(a.stdout)
					}
					err = c.print(a, rec, now)
				}
				if err != nil {
					return err
				}
				n++
			}
		}
		if n == 0 {
			where := ""
			if c.Scope != "" {
				where = " in scope " + shown(c.Scope)
			}
			return notFound("no record%s was last claimed by message UUID %s: its key was claimed by a later delivery, "+
				"its record was removed (Redis: expired; PostgreSQL: cleaned up), or it was written before oncemill kept the UUID", where, shown(c.UUID))
		}
		return nil
	})
}

// view is what inspect --json prints of rec.
func (c *inspectCmd) view(rec store.Record, now time.Time) inspectView {
	v := inspectView{recordView: viewOf(rec, now), Now: now}
	if c.Messages {
		s := base64.StdEncoding.EncodeToString(rec.Result)
		v.ResultBase64 = &s
		if msgs, omitted, err := result.Decode(rec.Result); err == nil {
			v.Omitted = omitted
			for _, m := range msgs {
				v.Messages = append(v.Messages, producedView{UUID: m.UUID, Metadata: m.Metadata, Payload: string(m.Payload)})
			}
		}
	}
	return v
}

// print prints rec as a table.
func (c *inspectCmd) print(a *app, rec store.Record, now time.Time) error {
	v := c.view(rec, now)
	t := newTable(a.stdout)
	t.row("scope", shown(v.Scope))
	t.row("key", shown(v.Key))
	t.row("status", v.Status)
	t.row("attempt", v.Attempt)
	t.row("token", v.Token)
	if v.Fingerprint != "" {
		t.row("fingerprint", shown(v.Fingerprint))
	}
	if v.MessageUUID != "" {
		t.row("message uuid", shown(v.MessageUUID))
	}
	t.row("created", fmt.Sprintf("%s (%s ago)", stamp(v.CreatedAt), fmtDuration(now.Sub(v.CreatedAt))))
	t.row("updated", fmt.Sprintf("%s (%s ago)", stamp(v.UpdatedAt), v.Age))
	if v.LeaseExpiresAt != nil {
		t.row("lease expires", stamp(*v.LeaseExpiresAt))
	} else {
		t.row("expires", stamp(v.ExpiresAt))
	}
	t.row("time left", v.ExpiresIn)
	t.row("result", fmt.Sprintf("%d bytes", v.ResultBytes))
	if v.ErrorKind != "" || v.ErrorMessage != "" {
		t.row("error kind", v.ErrorKind)
		t.row("error", oneLine(v.ErrorMessage, 200))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if c.Messages {
		return printProduced(a, v, rec.Result)
	}
	return nil
}

// printProduced prints the produced messages a success stored, or the raw
// bytes when they are not a result of the pipeline's encoding.
func printProduced(a *app, v inspectView, result []byte) error {
	switch {
	case v.Omitted:
		_, err := fmt.Fprintln(a.stdout, "\nthe produced messages were too large to store: a duplicate re-publishes nothing")
		return err
	case len(v.Messages) > 0:
		noun := "messages"
		if len(v.Messages) == 1 {
			noun = "message"
		}
		fmt.Fprintf(a.stdout, "\n%d produced %s, re-published to each duplicate:\n", len(v.Messages), noun)
		for _, m := range v.Messages {
			fmt.Fprintf(a.stdout, "  uuid %s, %d bytes: %s\n", shown(m.UUID), len(m.Payload), oneLine(m.Payload, 200))
			for _, k := range slices.Sorted(maps.Keys(m.Metadata)) {
				fmt.Fprintf(a.stdout, "    %s: %s\n", shown(k), oneLine(m.Metadata[k], 200))
			}
		}
		return nil
	}
	return dumpResult(a, result)
}

// dumpResult prints the stored result as a hex dump, for bytes that do not
// decode as produced messages.
func dumpResult(a *app, result []byte) error {
	if len(result) == 0 {
		_, err := fmt.Fprintln(a.stdout, "\nno produced messages stored (a success without output, or a failure)")
		return err
	}
	shownBytes := result[:min(len(result), maxDumpBytes)]
	fmt.Fprintf(a.stdout, "\nstored result, %d bytes (the produced messages as the pipeline encodes them):\n%s", len(result), hex.Dump(shownBytes))
	if len(shownBytes) < len(result) {
		fmt.Fprintf(a.stdout, "... %d more bytes; --json prints them all (result_base64)\n", len(result)-len(shownBytes))
	}
	return nil
}

// stamp prints a store time in UTC to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
