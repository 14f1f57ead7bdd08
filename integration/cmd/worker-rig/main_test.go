package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/integration/internal/worker"
)

var summaryLine = regexp.MustCompile(`^summary: published=\d+ deliveries=\d+ unique=\d+ effects=\d+ replays=\d+ cached_failures=\d+ double_effects=0 lost=0 msgs_per_sec=\d+$`)

// The README's run command, smaller: the demo passes, and its last stdout
// line is the summary.
func TestDemoEndsWithTheSummaryLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"--count=500", "--progress=0"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	if last := lines[len(lines)-1]; !summaryLine.MatchString(last) || !strings.HasPrefix(last, "summary: published=500 ") {
		t.Errorf("last stdout line %q does not match %v", last, summaryLine)
	}
	if !strings.HasPrefix(lines[0], "duplicates: redelivered=100 resent_new_uuid=50 invalid_amount=10;") {
		t.Errorf("first line %q does not say the demo's duplicates", lines[0])
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"one partition", []string{"--count=50", "--partitions=1", "--progress=0"}, 0},
		{"bad flag", []string{"--count=0"}, 2},
		{"a soak tool's flag", []string{"--no-idempotency"}, 2},
		{"help", []string{"-h"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := realMain(tt.args, &stdout, &stderr); got != tt.want {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", got, tt.want, stdout.String(), stderr.String())
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg != worker.DefaultConfig() {
		t.Errorf("no flags gave %+v, want the defaults", cfg)
	}
	cfg, err = parseFlags([]string{"--count=7", "--partitions=3", "--lease=2s", "--mode=consume", "--broker=sqs"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Count != 7 || cfg.Partitions != 3 || cfg.Lease != 2*time.Second || cfg.LogFormat != "json" || cfg.HTTPAddr != ":8080" {
		t.Errorf("flags or consume-mode defaults not applied: %+v", cfg)
	}
	cfg, err = parseFlags([]string{"--store=redis", "--ledger=postgres", "--ledger-postgres-dsn=postgres://l@db/x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Ledger != "postgres" || cfg.LedgerPostgresDSN != "postgres://l@db/x" {
		t.Errorf("--ledger flags not applied: %+v", cfg)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--count=0"}, "--count=0"},
		{[]string{"--lease=0s"}, "--lease=0s"},
		{[]string{"--timeout=-1s"}, "--timeout=-1s"},
		{[]string{"--nats-ack-wait=500ms"}, "--nats-ack-wait=500ms"},
		{[]string{"--nats-max-deliver=0"}, "--nats-max-deliver=0"},
		{[]string{"--nats-max-ack-pending=0"}, "--nats-max-ack-pending=0"},
		{[]string{"--broker=pulsar"}, `--broker="pulsar" is not available; choose one of: gochannel, kafka, amqp, sqs, nats`},
		{[]string{"--store=mysql"}, `--store="mysql" is not available; choose one of: memory, postgres, redis, tiered`},
		{[]string{"--mode=serve"}, `--mode="serve" is not available`},
		{[]string{"--mode=consume"}, "--mode=consume with --broker=gochannel"},
		{[]string{"--mode=produce"}, "--mode=produce with --broker=gochannel"},
		{[]string{"--sqs-visibility-timeout=1500ms"}, "whole seconds"},
		{[]string{"--kafka-partitions=0"}, "--kafka-partitions=0"},
		{[]string{"--kafka-session-timeout=30s"}, "must be below 30s"},
		{[]string{"--kafka-watermark", "--broker=kafka"}, "needs --broker=kafka and --store=postgres"},
		{[]string{"--drain-timeout=0s"}, "--drain-timeout=0s"},
		{[]string{"--ledger=redis"}, `--ledger="redis" is not available; choose one of: store, postgres`},
		{[]string{"--ledger=postgres", "--store=postgres"}, "--ledger=postgres with --store=postgres"},
		{[]string{"--log-level=loud"}, `--log-level="loud"`},
		{[]string{"--count=ten"}, "invalid value"},
		{[]string{"--stall=0.1"}, "flag provided but not defined: -stall"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range bad {
		_, err := parseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}

// -h names the topics as the worker creates them.
func TestHelpNamesTheTopics(t *testing.T) {
	var out bytes.Buffer
	if code := realMain([]string{"-h"}, io.Discard, &out); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.Contains(out.String(), "payments-0, payments-1") || strings.Contains(out.String(), "payments.") {
		t.Errorf("-h does not name the topics payments-0, payments-1, ...:\n%s", out.String())
	}
}
