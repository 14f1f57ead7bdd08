package exampletest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SQS returns the endpoint of an SQS emulator: ONCEMILL_SQS_ENDPOINT when it
// answers, else fauxqs, the emulator the integration tests pin
// (integration/fauxqs), installed with npm ci into a directory of this test
// and started on a free port of 127.0.0.1 until the test ends. Without
// Node.js and npm, or when fauxqs does not start, the test fails.
func SQS(t *testing.T) string {
	t.Helper()
	if ep := os.Getenv("ONCEMILL_SQS_ENDPOINT"); ep != "" {
		if err := sqsAnswers(ep); err != nil {
			t.Fatalf("ONCEMILL_SQS_ENDPOINT %s does not answer: %v", ep, err)
		}
		return ep
	}
	src := filepath.Join(repoRoot(t), "integration", "fauxqs")
	dir := t.TempDir()
	for _, name := range []string{"package.json", "package-lock.json", "server.mjs"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatalf("fauxqs launcher: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// In a directory of its own, so that it never races the integration
	// tests' npm ci in integration/fauxqs.
	npm := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefer-offline")
	npm.Dir = dir
	if out, err := npm.CombinedOutput(); err != nil {
		t.Fatalf("installing fauxqs (npm ci; Node.js and npm must be installed): %v\n%s", err, out)
	}

	log := &Log{}
	cmd := exec.Command("node", "server.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FAUXQS_PORT=0", "FAUXQS_BIND=127.0.0.1")
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting fauxqs (node server.mjs): %v", err)
	}
	exited := make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "fauxqs listening on "); ok {
				found <- addr
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	select {
	case ep := <-found:
		if err := sqsAnswers(ep); err != nil {
			t.Fatalf("fauxqs at %s: %v\n%s", ep, err, log)
		}
		return ep
	case <-exited:
		t.Fatalf("fauxqs exited before listening:\n%s", log)
	case <-time.After(60 * time.Second):
		t.Fatalf("fauxqs did not listen within 60s:\n%s", log)
	}
	return ""
}

// sqsAnswers asks the emulator for its queues (ListQueues, JSON protocol).
func sqsAnswers(endpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader("{}"))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS.ListQueues")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return errors.New("ListQueues: " + resp.Status + ": " + string(body))
	}
	return nil
}

// repoRoot is the directory of go.work, above the test's working directory
// (examples/ is a module of its own: its go.mod is not the root's).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the working directory")
		}
		dir = parent
	}
}
