package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDocs runs the shell commands of README.md and docs/*.md, read at run
// time, and fails when one fails: the documentation's commands are tested
// like its Go examples are.
//
// Which blocks run. The fenced code blocks tagged sh, bash, shell or console,
// and the untagged ones, because that is how the documents mark their
// commands today (tag new ones sh, and output text). An sh, bash, shell or
// untagged block is one bash script; in a console block only the lines
// starting with "$ " are commands (a trailing backslash continues one), the
// rest is output. Blocks tagged with another language (go, sql, promql,
// text, ...) are never run.
//
// Annotations. An HTML comment on the line right before the opening fence
// (blank lines between are allowed) says what to do instead:
//
//	<!-- smoke: skip: <reason> -->          commands that cannot run here: Docker,
//	                                         cloud accounts, placeholders, or too slow
//	                                         ("slow: covered by <test>")
//	<!-- smoke: not a command: <what> -->   an untagged block that is output, a diagram
//	                                         or a format (better: tag it text)
//	<!-- smoke: stop after: <duration> -->  commands the docs say run until stopped
//
// Every skipped block is logged with its reason; an annotation that is not
// right before a block, or that the test does not know, fails the test.
//
// How a block runs. Sequentially, in the order of the files, each as a
// subtest named after its file and line (a block whose commands an earlier
// block ran already is logged, not run again), with bash from the repository
// root under "set -eo pipefail", in a process group of its own, killed
// whole at blockTimeout. The commands find the services and brokers of
// TestMain through the ONCEMILL_* variables the example worker reads, and a
// namespace of this run for the worker's schema and Redis prefix, dropped
// at the end; scripts/brokers gets a directory and free ports of its own, so
// it never meets a developer's brokers. The worker's HTTP endpoints listen
// on a free port. A benchmark without a -benchtime of its own runs 100 ms
// instead of a second (GOFLAGS=-benchtime=100ms; the command's own flags
// win): the test checks that a command works, not its figures.
//
// Long-running commands. A command started in the background (&) is one the
// docs leave running: it must still be running when the block's last
// command ends (a background worker that exited with an error fails the
// block), and is then stopped with SIGTERM to the block's process group,
// SIGKILL after stopGrace. Its exit status is not judged: `go run` dies of
// SIGTERM instead of passing it on. A block annotated "stop after" gets a
// Ctrl-C at that time: SIGINT to its process group, which reaches the
// program under `go run` as in a terminal. It must then exit 0, as a worker
// that drains on a signal does.
//
// A go test command whose -run or -bench pattern matches nothing exits 0;
// such a block fails too, since the command no longer does what the docs
// say.
func TestDocs(t *testing.T) {
	t.Parallel() // its blocks run one at a time, beside the other tests
	start := time.Now()
	blocks, err := readDocs("..")
	if err != nil {
		t.Fatal(err)
	}
	ns := docsNamespace(t)
	environ := docsEnv(t, ns)

	var ran, failed, repeated, skipped, notCommands int
	ranAt := map[string]string{} // commands -> the block that ran them
	for _, b := range blocks {
		key := fmt.Sprint(b.stopAfter, b.script)
		if first, ok := ranAt[key]; ok && b.action == actionRun {
			repeated++
			t.Logf("%s: the same commands as %s, not run again", b.where(), first)
			continue
		}
		switch b.action {
		case actionSkip:
			skipped++
			t.Logf("%s: skipped (%s): %s", b.where(), b.reason, firstLine(b.script))
		case actionNotACommand:
			notCommands++
			t.Logf("%s: not a command (%s)", b.where(), b.reason)
		case actionRun:
			ran++
			ranAt[key] = b.where()
			if !t.Run(b.where(), func(t *testing.T) { runDocBlock(t, b, environ) }) {
				failed++
			}
		}
	}
	if ran == 0 {
		t.Errorf("no shell command found in README.md and docs/*.md; has the way they mark commands changed?")
	}
	t.Logf("%d blocks ran: %d passed, %d failed; %d repeated a block before them; %d skipped; %d not commands; %v",
		ran, ran-failed, failed, repeated, skipped, notCommands, time.Since(start).Round(time.Second))
}

// TestDocsParse reads made-up documents, so that a change to the parser
// shows here rather than as a puzzling failure of a real document. The
// literals write each fence as three single quotes, since a raw string
// cannot hold backticks.
func TestDocsParse(t *testing.T) {
	fences := strings.NewReplacer("'''", "```")
	doc := fences.Replace(`Intro.

<!-- smoke: skip: needs Docker -->
'''
docker compose up
'''

'''sh
echo one
'''

'''console
$ echo two
two
$ echo three \
  four
three four
'''

<!-- smoke: not a command: program output -->
'''
summary: ok
'''

'''go
fmt.Println()
'''

<!-- smoke: stop after: 10s -->

  '''bash
  go run ./cmd/example-worker --mode=consume
  '''
`)
	blocks, err := parseDoc("x.md", doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []docBlock{
		{file: "x.md", line: 4, action: actionSkip, reason: "needs Docker", script: "docker compose up"},
		{file: "x.md", line: 8, action: actionRun, script: "echo one"},
		{file: "x.md", line: 12, action: actionRun, script: "echo two\necho three \\\n  four"},
		{file: "x.md", line: 21, action: actionNotACommand, reason: "program output", script: "summary: ok"},
		{file: "x.md", line: 25},
		{file: "x.md", line: 31, action: actionRun, stopAfter: 10 * time.Second, script: "go run ./cmd/example-worker --mode=consume"},
	}
	if fmt.Sprintf("%+v", blocks) != fmt.Sprintf("%+v", want) {
		t.Errorf("got  %+v\nwant %+v", blocks, want)
	}

	for _, bad := range []string{
		"<!-- smoke: skip: x -->\nsome prose\n'''\nls\n'''\n", // not right before its block
		"<!-- smoke: skip -->\n'''\nls\n'''\n",                // no reason
		"<!-- smoke: later -->\n'''\nls\n'''\n",               // unknown
		"<!-- smoke: skip: x -->\n'''go\nx := 1\n'''\n",       // on a block never run
		"<!-- smoke: not a command: x -->\n'''sh\nls\n'''\n",  // a tagged shell block is commands
		"<!-- smoke: stop after: soon -->\n'''\nls\n'''\n",    // no duration
		"<!-- smoke skip: x -->\n'''\nls\n'''\n",              // misspelt
		"'''\nls\n",                                           // never closed
		"'''console\nno prompt\n'''\n",                        // nothing to run
	} {
		if _, err := parseDoc("x.md", fences.Replace(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

// TestDocsRunScript runs made-up blocks: what the runner judges, and that
// it leaves nothing running.
func TestDocsRunScript(t *testing.T) {
	for _, c := range []struct {
		name      string
		commands  string
		stopAfter time.Duration
		ok        bool
	}{
		{"success", "echo hello", 0, true},
		{"failure", "false\necho not reached", 0, false},
		{"failure in a pipeline", "false | cat", 0, false},
		{"left running in the background", "sleep 600 &\necho started", 0, true},
		{"background command failed", "(sleep 0.1; exit 3) &\nsleep 1", 0, false},
		{"stopped by Ctrl-C, exits 0", `bash -c 'trap "exit 0" INT; sleep 600 & wait'`, 500 * time.Millisecond, true},
		{"stopped by Ctrl-C, dies of it", "sleep 600", 500 * time.Millisecond, false},
	} {
		start := time.Now()
		out, err := runScript(c.commands, os.Environ(), c.stopAfter)
		if (err == nil) != c.ok {
			t.Errorf("%s: error %v, want ok=%v; output:\n%s", c.name, err, c.ok, out)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: took %v: what it started was not stopped", c.name, d)
		}
	}
}

// TestDocsRanNothing: a go test command that exits 0 having run nothing.
func TestDocsRanNothing(t *testing.T) {
	for _, c := range []struct {
		script, out string
		nothing     bool
	}{
		{"go test ./x", "ok  \tpkg\t0.1s\n", false},
		{"go test -run X ./x", "ok  \tpkg\t0.004s [no tests to run]\n", true},
		{"go test -run X ./...", "ok  \ta\t0.004s [no tests to run]\nok  \tb\t1.2s\n", false},
		{"go test -run='^$' -bench=X ./x", "PASS\nok  \tpkg\t0.004s\n", true},
		{"go test -run='^$' -bench=X ./x", "BenchmarkX-2 \t 100 \t 5 ns/op\nPASS\nok  \tpkg\t0.3s\n", false},
		{"echo ok", "ok\n", false},
	} {
		if err := ranNothing(c.script, c.out); (err != nil) != c.nothing {
			t.Errorf("%s with output %q: %v, want ran nothing=%v", c.script, c.out, err, c.nothing)
		}
	}
}

// What TestDocs does with a block.
type blockAction int

const (
	actionIgnore      blockAction = iota // another language
	actionRun                            // shell commands
	actionSkip                           // shell commands annotated skip
	actionNotACommand                    // untagged, annotated not a command
)

const (
	// blockTimeout bounds one block, whatever it runs.
	blockTimeout = 3 * time.Minute
	// stopGrace is how long what a block left running has to exit after
	// SIGTERM.
	stopGrace = 15 * time.Second
)

// docBlock is one fenced code block of a Markdown file.
type docBlock struct {
	file      string // relative to the repository root
	line      int    // of the opening fence
	action    blockAction
	reason    string        // of a skip, or what a block that is not a command is
	stopAfter time.Duration // from a "stop after" annotation; 0: none
	script    string        // the commands to run
}

func (b docBlock) where() string { return b.file + ":" + strconv.Itoa(b.line) }

// readDocs returns the code blocks of README.md and docs/*.md under root.
func readDocs(root string) ([]docBlock, error) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []docBlock
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, f)
		if err != nil {
			return nil, err
		}
		blocks, err := parseDoc(filepath.ToSlash(rel), string(data))
		if err != nil {
			return nil, err
		}
		out = append(out, blocks...)
	}
	return out, nil
}

var annotation = regexp.MustCompile(`^<!--\s*smoke:\s*(.*?)\s*-->$`)

// parseDoc returns the fenced code blocks of one Markdown file, each with
// what to do with it.
func parseDoc(file, text string) ([]docBlock, error) {
	var (
		out     []docBlock
		note    string // the annotation waiting for its block
		noteAt  int
		fence   string // the open fence; "" outside a block
		indent  string
		info    string
		startAt int
		body    []string
	)
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				b, err := newDocBlock(file, startAt, info, note, body)
				if err != nil {
					return nil, err
				}
				out = append(out, b)
				fence, note = "", ""
				continue
			}
			body = append(body, strings.TrimPrefix(line, indent))
			continue
		}
		if f := openingFence(trimmed); f != "" {
			fence, startAt, body = f, n, nil
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
			info = strings.TrimSpace(strings.TrimPrefix(trimmed, f))
			continue
		}
		if trimmed == "" {
			continue
		}
		if note != "" {
			return nil, fmt.Errorf("%s:%d: the annotation %q is not right before a code block", file, noteAt, note)
		}
		if m := annotation.FindStringSubmatch(trimmed); m != nil {
			note, noteAt = m[1], n
		} else if strings.Contains(trimmed, "<!-- smoke") {
			return nil, fmt.Errorf("%s:%d: cannot read the annotation %q; write <!-- smoke: ... --> on a line of its own", file, n, trimmed)
		}
	}
	if fence != "" {
		return nil, fmt.Errorf("%s:%d: the code block is never closed", file, startAt)
	}
	if note != "" {
		return nil, fmt.Errorf("%s:%d: the annotation %q is not right before a code block", file, noteAt, note)
	}
	return out, nil
}

// openingFence returns the backticks or tildes that open a code block on
// line, or "".
func openingFence(line string) string {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// newDocBlock decides what to do with a block from its fence's info string
// and its annotation.
func newDocBlock(file string, line int, info, note string, body []string) (docBlock, error) {
	b := docBlock{file: file, line: line}
	lang, _, _ := strings.Cut(info, " ")
	switch lang {
	case "", "sh", "bash", "shell":
		b.script = strings.Join(body, "\n")
	case "console":
		b.script = consoleCommands(body)
	default:
		if note != "" {
			return b, fmt.Errorf("%s: a %s block is never run; remove the annotation %q", b.where(), lang, note)
		}
		return b, nil // another language
	}
	b.action = actionRun
	kind, arg, _ := strings.Cut(note, ":")
	arg = strings.TrimSpace(arg)
	switch kind {
	case "":
	case "skip":
		b.action, b.reason = actionSkip, arg
	case "not a command":
		if lang != "" {
			return b, fmt.Errorf("%s: a block tagged %s is commands; drop the tag (or tag it text) instead of %q", b.where(), lang, note)
		}
		b.action, b.reason = actionNotACommand, arg
	case "stop after":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 || d >= blockTimeout {
			return b, fmt.Errorf("%s: %q: give a duration below %v, e.g. <!-- smoke: stop after: 10s -->", b.where(), note, blockTimeout)
		}
		b.stopAfter = d
	default:
		return b, fmt.Errorf("%s: unknown annotation %q; use skip: <reason>, not a command: <what>, or stop after: <duration>", b.where(), note)
	}
	if arg == "" && b.action != actionRun {
		return b, fmt.Errorf("%s: the annotation %q needs a reason after the colon", b.where(), note)
	}
	if b.action == actionRun && strings.TrimSpace(b.script) == "" {
		return b, fmt.Errorf("%s: the block has no command", b.where())
	}
	return b, nil
}

// consoleCommands returns the "$ " lines of a console block, with the lines
// they continue with a trailing backslash.
func consoleCommands(body []string) string {
	var cmds []string
	continued := false
	for _, l := range body {
		switch {
		case continued:
			cmds = append(cmds, l)
		case strings.HasPrefix(l, "$ "):
			cmds = append(cmds, strings.TrimPrefix(l, "$ "))
		default:
			continue
		}
		continued = strings.HasSuffix(l, "\\")
	}
	return strings.Join(cmds, "\n")
}

// The script around a block's commands. The DEBUG trap notes the pid of
// every command started in the background ($! before each command); the
// check after the block fails it if one of them has already exited with an
// error, since the docs leave them running.
const (
	scriptHead = "set -eo pipefail\ntrap '__smoke_bg[${!:-0}]=1' DEBUG\n"
	scriptTail = `
trap - DEBUG
for pid in "${!__smoke_bg[@]}"; do
	if [ "$pid" != 0 ] && ! kill -0 "$pid" 2>/dev/null; then
		wait "$pid" || { echo "smoke: a command this block started in the background (pid $pid) exited with status $?" >&2; exit 1; }
	fi
done
`
)

// runDocBlock runs one block and fails t if it fails.
func runDocBlock(t *testing.T, b docBlock, environ []string) {
	start := time.Now()
	out, err := runScript(b.script, environ, b.stopAfter)
	if err == nil {
		err = ranNothing(b.script, out)
	}
	if err != nil {
		t.Errorf("%s failed: %v\ncommands:\n%s\noutput (last lines):\n%s", b.where(), err, b.script, lastLines(out, 60))
		return
	}
	t.Logf("ok in %v: %s", time.Since(start).Round(100*time.Millisecond), lastLines(out, 2))
}

// runScript runs commands with bash from the repository root, in a process
// group of its own, and returns their combined output. Processes the
// commands left running are stopped (SIGTERM, then SIGKILL after stopGrace)
// before it returns.
func runScript(commands string, environ []string, stopAfter time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", scriptHead+commands+"\n"+scriptTail)
	cmd.Dir = ".."
	cmd.Env = environ
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// At the deadline the whole group goes, not bash alone: a hung command
	// is a child of bash.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

	// The output goes through a pipe of our own, not a Writer, so that Wait
	// returns when bash ends, while what it left running may still write.
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, r); close(copied) }()

	if stopAfter > 0 {
		// Ctrl-C, as a reader stops a command that runs until stopped.
		stop := time.AfterFunc(stopAfter, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) })
		defer stop.Stop()
	}
	err = cmd.Wait()
	stopGroup(cmd.Process.Pid, copied)
	select {
	case <-copied:
	case <-time.After(5 * time.Second):
		_ = r.Close() // something outside the group holds the pipe
		<-copied
	}

	switch {
	case ctx.Err() != nil:
		return out.String(), fmt.Errorf("still running after %v, killed", blockTimeout)
	case err != nil:
		return out.String(), err
	}
	return out.String(), nil
}

// stopGroup stops what is left of process group pgid: SIGTERM, then
// SIGKILL if the group's output is still open after stopGrace.
func stopGroup(pgid int, outputClosed <-chan struct{}) {
	if syscall.Kill(-pgid, syscall.SIGTERM) != nil {
		return // nothing left
	}
	select {
	case <-outputClosed:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

var (
	packageLine   = regexp.MustCompile(`(?m)^ok\s.*$`)
	benchmarkLine = regexp.MustCompile(`(?m)^Benchmark\S`)
)

// ranNothing reports a go test command of script that ran no test or no
// benchmark: it exits 0, but it no longer does what the docs say.
func ranNothing(script, out string) error {
	oks := packageLine.FindAllString(out, -1)
	empty := 0
	for _, l := range oks {
		if strings.HasSuffix(l, "[no tests to run]") {
			empty++
		}
	}
	if empty > 0 && empty == len(oks) {
		return errors.New("a go test command ran no test: its -run pattern matches none")
	}
	if strings.Contains(script, "go test") && strings.Contains(script, "-bench") && !benchmarkLine.MatchString(out) {
		return errors.New("a go test -bench command ran no benchmark: its -bench pattern matches none")
	}
	return nil
}

// docsNamespace is the example worker's PostgreSQL schema and Redis prefix
// for this run, removed when the test ends.
func docsNamespace(t *testing.T) string {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "docs_" + hex.EncodeToString(raw[:])
	t.Cleanup(func() {
		for _, s := range storeKinds {
			s.cleanup(t, ns)
		}
	})
	return ns
}

// docsEnv is the environment of the documented commands: TestMain's
// services and brokers where the example worker (and the tests the
// commands run) look for them, the namespace, a free port for the worker's
// HTTP endpoints, a directory and free ports for scripts/brokers, and short
// benchmarks.
func docsEnv(t *testing.T, ns string) []string {
	return append(os.Environ(),
		"GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -benchtime=100ms"),
		"ONCEMILL_POSTGRES_DSN="+env.postgresDSN,
		"ONCEMILL_REDIS_ADDR="+env.redisAddr,
		"ONCEMILL_AMQP_URL="+env.amqpURL,
		"ONCEMILL_KAFKA_BROKERS="+env.kafkaAddr,
		"ONCEMILL_SQS_ENDPOINT="+env.sqsEndpoint,
		"ONCEMILL_POSTGRES_SCHEMA="+ns,
		"ONCEMILL_REDIS_PREFIX="+ns,
		"ONCEMILL_HTTP_ADDR=127.0.0.1:0",
		"ONCEMILL_BROKERS_DIR="+t.TempDir(),
		"KAFKA_PORT="+freePort(t),
		"SQS_PORT="+freePort(t),
	)
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// firstLine returns the first command of a script, for the log.
func firstLine(script string) string {
	for _, l := range strings.Split(script, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

// lastLines returns the last n non-empty lines of s.
func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
