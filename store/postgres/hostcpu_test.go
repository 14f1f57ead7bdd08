package postgres_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
)

// hostCPU is what the machine spent, read from the kernel: this process's
// CPU time (testenv.ProcessCPU) and write system calls (/proc/self/io: a
// batch goes out in one write, so about one a round trip), and the CPU time
// of every process named postgres (testenv.PidCPU): the backends and the
// server's own processes, so a cleaner's pass counts to whichever round it
// falls in. A benchmark reads it around its rounds to say where a message's
// time goes, client or server, which msgs/s alone cannot.
type hostCPU struct {
	client, server time.Duration
	writes         int64
}

// readHostCPU reads it, and how many postgres processes it read: none
// when the server runs on another machine.
func readHostCPU() (h hostCPU, servers int, err error) {
	if h.client, err = testenv.ProcessCPU(); err != nil {
		return h, 0, err
	}
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return h, 0, err
	}
	for line := range strings.Lines(string(io)) {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			h.writes, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return h, 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		// A process that ended meanwhile is skipped.
		if name, cpu, err := testenv.PidCPU(pid); err == nil && name == "postgres" {
			h.server += cpu
			servers++
		}
	}
	return h, servers, nil
}

// plus is h and what was spent from before to after.
func (h hostCPU) plus(before, after hostCPU) hostCPU {
	return hostCPU{
		client: h.client + after.client - before.client,
		server: h.server + after.server - before.server,
		writes: h.writes + after.writes - before.writes,
	}
}

// perMessage renders h spread over n messages: client and server µs (the
// server's only when it was read), and the client's writes.
func (h hostCPU) perMessage(n int, server bool) string {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	s := fmt.Sprintf("client %.1f µs", us(h.client))
	if server {
		s += fmt.Sprintf(", server %.1f µs", us(h.server))
	}
	return s + fmt.Sprintf(", %.2f writes", float64(h.writes)/float64(n))
}

// TestReadHostCPU: the readings behind the benchmarks' CPU per message work
// here, without a database: this process has used CPU, and any postgres
// process found has a time (zero for one that has not run a tick yet).
func TestReadHostCPU(t *testing.T) {
	h, servers, err := readHostCPU()
	if err != nil {
		t.Fatal(err)
	}
	if h.client <= 0 || h.writes < 0 || h.server < 0 {
		t.Errorf("readHostCPU() = %+v with %d postgres processes, want client CPU above zero", h, servers)
	}
}
