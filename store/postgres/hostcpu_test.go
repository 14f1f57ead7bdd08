package postgres_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hostCPU is what the machine spent, read from the kernel: this process's
// CPU time (getrusage) and write system calls (/proc/self/io: a batch goes
// out in one write, so about one a round trip), and the CPU time of every
// process named postgres (/proc/PID/stat): the backends and the server's
// own processes, so a cleaner's pass counts to whichever round it falls in.
// A benchmark reads it around its rounds to say where a message's time
// goes, client or server, which msgs/s alone cannot.
type hostCPU struct {
	client, server time.Duration
	writes         int64
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// readHostCPU reads it, and how many postgres processes it read: none
// when the server runs on another machine.
func readHostCPU() (h hostCPU, servers int, err error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return h, 0, fmt.Errorf("getrusage: %w", err)
	}
	h.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		if ticks, ok := postgresTicks(p.Name()); ok {
			h.server += time.Duration(ticks) * time.Second / clockTicks
			servers++
		}
	}
	return h, servers, nil
}

// postgresTicks is the user and system time of process pid, if it is a
// postgres process. A process that ended meanwhile is skipped.
func postgresTicks(pid string) (int64, bool) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// pid (comm) state ppid …: comm may hold spaces, so fields count from
	// its closing parenthesis; utime and stime are the 14th and 15th.
	open, closing := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || closing < open || string(stat[open+1:closing]) != "postgres" {
		return 0, false
	}
	f := strings.Fields(string(stat[closing+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, uerr := strconv.ParseInt(f[11], 10, 64)
	stime, serr := strconv.ParseInt(f[12], 10, 64)
	if uerr != nil || serr != nil {
		return 0, false
	}
	return utime + stime, true
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
