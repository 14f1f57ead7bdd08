package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// sqsServer is the SQS emulator the tests use.
type sqsServer struct {
	endpoint string
	origin   string // "fauxqs started here" or "ONCEMILL_SQS_ENDPOINT"
	stop     func()
}

// startSQS uses the emulator at ONCEMILL_SQS_ENDPOINT when one answers
// there; otherwise it installs fauxqs from fauxqs/package-lock.json (npm ci,
// when node_modules is missing or older than the lockfile) and starts it on
// a free port of 127.0.0.1, stopping it when the tests end.
func startSQS(tmp string) (*sqsServer, error) {
	if ep := os.Getenv("ONCEMILL_SQS_ENDPOINT"); ep != "" && sqsAnswers(ep) == nil {
		return &sqsServer{endpoint: ep, origin: "ONCEMILL_SQS_ENDPOINT", stop: func() {}}, nil
	}
	if err := npmCI("fauxqs"); err != nil {
		return nil, err
	}
	logPath := filepath.Join(tmp, "fauxqs.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("node", "server.mjs")
	cmd.Dir = "fauxqs"
	cmd.Env = append(os.Environ(), "FAUXQS_PORT=0", "FAUXQS_BIND=127.0.0.1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting fauxqs (node fauxqs/server.mjs): %w", err)
	}
	exited := make(chan struct{})
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	}

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

	select {
	case ep := <-found:
		if err := sqsAnswers(ep); err != nil {
			stop()
			return nil, fmt.Errorf("fauxqs at %s: %w (log: %s)", ep, err, logPath)
		}
		return &sqsServer{endpoint: ep, origin: "fauxqs started here", stop: stop}, nil
	case <-exited:
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("fauxqs exited before listening:\n%s", out)
	case <-time.After(60 * time.Second):
		stop()
		return nil, fmt.Errorf("fauxqs did not listen within 60 s (log: %s)", logPath)
	}
}

// npmCI installs dir's locked dependencies unless node_modules is newer
// than the lockfile.
func npmCI(dir string) error {
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return fmt.Errorf("fauxqs lockfile: %w", err)
	}
	if mods, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && mods.ModTime().After(lock.ModTime()) {
		return nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("npm ci in integration/%s (Node.js and npm must be installed): %w\n%s", dir, err, out)
	}
	return nil
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
