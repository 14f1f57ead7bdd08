package main

// How records and durations are printed: aligned tables for people, JSON
// for scripts. Durations are Go duration strings ("3m2s") in both.

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/oncemill/oncemill/store"
)

// recordView is a record as the commands print it, judged at the store's
// time now.
type recordView struct {
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	Status      string `json:"status"`
	Live        bool   `json:"live"` // unexpired: Get returns it, ClaimLease decides by it
	Attempt     int    `json:"attempt"`
	Token       int64  `json:"token"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// MessageUUID is the UUID of the message that last claimed the key.
	MessageUUID string `json:"message_uuid,omitempty"`

	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	ExpiresAt      time.Time  `json:"expires_at"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// ExpiresIn is the time left; negative once expired.
	ExpiresIn string `json:"expires_in"`
	// Age is the time since the record was last written (ClaimLease, heartbeat,
	// Complete, Release).
	Age string `json:"age"`

	ResultBytes  int    `json:"result_bytes"`
	ErrorKind    string `json:"error_kind,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`

	expiresIn time.Duration
	age       time.Duration
}

func viewOf(r store.Record, now time.Time) recordView {
	v := recordView{
		Scope: r.Scope, Key: r.Key, Status: r.Status.String(),
		Live:    r.ExpiresAt.After(now),
		Attempt: r.Attempt, Token: r.Token, Fingerprint: r.Fingerprint, MessageUUID: r.MessageUUID,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt,
		ResultBytes: len(r.Result), ErrorKind: string(r.ErrorKind), ErrorMessage: r.ErrorMessage,
		expiresIn: r.ExpiresAt.Sub(now), age: now.Sub(r.UpdatedAt),
	}
	if r.Status == store.StatusInProgress && !r.LeaseExpiresAt.IsZero() {
		t := r.LeaseExpiresAt
		v.LeaseExpiresAt = &t
	}
	v.ExpiresIn, v.Age = fmtDuration(v.expiresIn), fmtDuration(v.age)
	return v
}

// fmtDuration rounds d for reading: whole seconds from a minute up, tenths
// of a second from a second up, milliseconds below.
func fmtDuration(d time.Duration) string {
	switch a := d.Abs(); {
	case a >= time.Minute:
		d = d.Round(time.Second)
	case a >= time.Second:
		d = d.Round(100 * time.Millisecond)
	case a >= time.Millisecond:
		d = d.Round(time.Millisecond)
	}
	return d.String()
}

// expiryText says when a record expires or expired, for tables.
func expiryText(d time.Duration) string {
	if d > 0 {
		return "in " + fmtDuration(d)
	}
	return "expired " + fmtDuration(-d) + " ago"
}

// shown prints a scope or key so that a table stays readable: as it is when
// it is plain printable text, quoted otherwise (empty, spaces, control
// characters).
func shown(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}

// id is "scope/key" for messages.
func id(scope, key string) string { return shown(scope) + "/" + shown(key) }

// oneLine shortens an error message for a table cell.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8Start(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table { return &table{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

func (t *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(t.tw, "\t")
		}
		fmt.Fprint(t.tw, c)
	}
	fmt.Fprint(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeJSONIndented writes v as one indented JSON object.
func writeJSONIndented(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// recordColumns are the columns of list and purge.
var recordColumns = []any{"SCOPE", "KEY", "STATUS", "ATTEMPT", "TOKEN", "AGE", "EXPIRES", "RESULT", "ERROR"}

func (v recordView) cells() []any {
	errText := ""
	if v.ErrorKind != "" || v.ErrorMessage != "" {
		errText = oneLine(v.ErrorKind+": "+v.ErrorMessage, 60)
	}
	return []any{shown(v.Scope), shown(v.Key), v.Status, v.Attempt, v.Token, v.Age, expiryText(v.expiresIn), fmt.Sprintf("%dB", v.ResultBytes), errText}
}
