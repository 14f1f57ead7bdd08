package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

var summaryLine = regexp.MustCompile(`^summary: published=\d+ deliveries=\d+ unique=\d+ effects=\d+ replays=\d+ cached_failures=\d+ double_effects=0 lost=0 msgs_per_sec=\d+$`)

// The README's run command, smaller: the demo passes, and its last stdout
// line is the summary.
func TestDemoEndsWithTheSummaryLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"--count=500"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	if last := lines[len(lines)-1]; !summaryLine.MatchString(last) || !strings.HasPrefix(last, "summary: published=500 ") {
		t.Errorf("last stdout line %q does not match %v", last, summaryLine)
	}
	// 500 commands: 100 delivered twice, 50 sent again under a new UUID, 10
	// invalid (cached failures, no charge).
	want := "summary: published=500 deliveries=650 unique=500 effects=490 "
	// Before it, where its records are: the scope the runbook's commands
	// look at, and payment IDs of this run.
	records := regexp.MustCompile(`^records: scope=payments payment_ids=p-([0-9A-Za-z]+)-000001\.\.p-([0-9A-Za-z]+)-000500$`)
	if len(lines) < 2 {
		t.Fatalf("stdout has %d lines, want the records line before the summary", len(lines))
	}
	if m := records.FindStringSubmatch(lines[len(lines)-2]); m == nil || m[1] != m[2] {
		t.Errorf("the line before the summary, %q, does not match %v", lines[len(lines)-2], records)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, want) {
		t.Errorf("last stdout line %q does not start with %q", last, want)
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"one partition", []string{"--count=50", "--partitions=1"}, 0},
		{"bad flag", []string{"--count=0"}, 2},
		{"a soak tool's flag", []string{"--no-idempotency"}, 2},
		{"a test rig's flag, now a constant", []string{"--lease=2s"}, 2},
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
	if cfg.mode != "run" || cfg.broker != "gochannel" || cfg.store != "memory" || cfg.count != 10000 || cfg.partitions != 8 ||
		cfg.httpAddr != ":8080" || cfg.sqsVisibility != 30*time.Second {
		t.Errorf("no flags gave %+v, want the demo's defaults", cfg)
	}
	cfg, err = parseFlags([]string{"--count=7", "--partitions=3", "--mode=consume", "--broker=sqs", "--sqs-visibility-timeout=1s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.count != 7 || cfg.partitions != 3 || cfg.mode != "consume" || cfg.broker != "sqs" || cfg.sqsVisibility != time.Second {
		t.Errorf("flags not applied: %+v", cfg)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--count=0"}, "--count=0"},
		{[]string{"--broker=pulsar"}, `--broker="pulsar" is not available; choose one of: gochannel, kafka, amqp, sqs, nats`},
		{[]string{"--store=sqlite"}, `--store="sqlite" is not available; choose one of: memory, file, postgres, mysql, redis`},
		{[]string{"--mode=serve"}, `--mode="serve" is not available`},
		{[]string{"--mode=consume"}, "--mode=consume with --broker=gochannel"},
		{[]string{"--mode=produce"}, "--mode=produce with --broker=gochannel"},
		{[]string{"--partitions=0"}, "--partitions=0"},
		{[]string{"--drain-timeout=1s"}, "flag provided but not defined: -drain-timeout"},
		{[]string{"--log-level=debug"}, "flag provided but not defined: -log-level"},
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
