package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// worker is one process of the worker rig (or of the soak tool) in
// consume mode.
type worker struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	logs string // its stderr: JSON log lines

	mu      sync.Mutex
	lines   []string      // its stdout
	changed chan struct{} // closed and replaced on each stdout line
	exited  chan struct{}
	waitErr error
}

// startWorker starts bin with args after the common ones and waits until
// its router runs (the "consuming:" line). The test's cleanup kills it if
// it is still running.
func startWorker(t *testing.T, bin, name string, args ...string) *worker {
	t.Helper()
	w := &worker{
		t:       t,
		name:    name,
		logs:    filepath.Join(t.TempDir(), name+".log"),
		changed: make(chan struct{}),
		exited:  make(chan struct{}),
	}
	logFile, err := os.Create(w.logs)
	if err != nil {
		t.Fatal(err)
	}
	w.cmd = exec.Command(bin, append([]string{
		"--mode=consume", "--log-level=debug", "--log-format=json", "--http-addr=127.0.0.1:0",
	}, args...)...)
	w.cmd.Stderr = logFile
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	go func() {
		err := w.cmd.Wait()
		_ = logFile.Close()
		w.mu.Lock()
		w.waitErr = err
		w.mu.Unlock()
		close(w.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
		if t.Failed() {
			t.Logf("%s stdout:\n%s\n%s log (last lines):\n%s", name, strings.Join(w.stdout(), "\n"), name, w.tailLog(40))
		}
	})
	w.waitLine("consuming:", 60*time.Second)
	return w
}

// waitLine waits for a stdout line starting with prefix and returns it.
func (w *worker) waitLine(prefix string, limit time.Duration) string {
	w.t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, l := range w.lines {
			if strings.HasPrefix(l, prefix) {
				w.mu.Unlock()
				return l
			}
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-w.exited:
			w.t.Fatalf("%s exited (%v) before printing %q; log:\n%s", w.name, w.waitErr, prefix, w.tailLog(40))
		case <-deadline.C:
			w.t.Fatalf("%s printed no %q line within %v; log:\n%s", w.name, prefix, limit, w.tailLog(40))
		}
	}
}

func (w *worker) stdout() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

// httpAddr is where the worker serves /metrics, /healthz and /readyz.
func (w *worker) httpAddr() string {
	return strings.TrimPrefix(w.waitLine("listening: ", time.Second), "listening: http://")
}

// kill ends the process with SIGKILL: no drain, no ack, no offset commit.
func (w *worker) kill() {
	w.t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatalf("SIGKILL %s: %v", w.name, err)
	}
	<-w.exited
}

// stop sends SIGTERM and waits for the drained worker to exit 0.
func (w *worker) stop() {
	w.t.Helper()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(60 * time.Second):
		w.t.Fatalf("%s did not exit within 60 s of SIGTERM; log:\n%s", w.name, w.tailLog(40))
	}
	if w.waitErr != nil {
		w.t.Fatalf("%s exited with %v after SIGTERM; log:\n%s", w.name, w.waitErr, w.tailLog(40))
	}
	w.assertJSONLog()
}

// assertJSONLog checks that every line of the worker's log is a JSON
// record: the store clients (go-redis) log through the worker's logger, and
// durations are strings ("20s"), not nanoseconds.
func (w *worker) assertJSONLog() {
	w.t.Helper()
	data, err := os.ReadFile(w.logs)
	if err != nil {
		w.t.Fatal(err)
	}
	drained := false
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			w.t.Errorf("%s logged a line that is not JSON: %q", w.name, line)
			continue
		}
		if rec["msg"] == "Draining the messages in flight" {
			drained = rec["timeout"] == "20s"
		}
	}
	if !drained {
		w.t.Errorf("%s did not log its drain with timeout \"20s\"; log:\n%s", w.name, w.tailLog(10))
	}
}

// event is one "delivery" log line: what oncemill decided.
type event struct {
	Msg         string `json:"msg"`
	Outcome     string `json:"outcome"`
	MessageUUID string `json:"message_uuid"`
	Key         string `json:"key"`
	Attempt     int    `json:"attempt"`
	Error       string `json:"error"`
}

// events returns the deliveries the worker logged so far.
func (w *worker) events() []event {
	w.t.Helper()
	data, err := os.ReadFile(w.logs)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []event
	for _, line := range bytes.Split(data, []byte("\n")) {
		var ev event
		if json.Unmarshal(line, &ev) == nil && ev.Msg == "delivery" {
			out = append(out, ev)
		}
	}
	return out
}

func (w *worker) tailLog(n int) string {
	data, _ := os.ReadFile(w.logs)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// outcomes counts events by outcome, over several workers.
func outcomes(ws ...*worker) map[string]int {
	out := map[string]int{}
	for _, w := range ws {
		for _, ev := range w.events() {
			out[ev.Outcome]++
		}
	}
	return out
}

// eventually polls cond every 50 ms until it holds; past limit (a hang
// guard, not a speed requirement) the test fails with what describe says.
func eventually(t *testing.T, limit time.Duration, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not so after %v: %s", limit, describe())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fmtMap[V any](m map[string]V) string { return fmt.Sprintf("%v", m) }
