package testenv

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// PidCPU is the CPU time process pid has used so far, user and system, and
// its name (comm, at most 15 bytes), read from /proc/PID/stat: Linux only,
// and to the tick (10 ms), so read it around many messages. A benchmark
// reads it around its rounds for the server's share of a message; an error
// says the process is gone or the platform has no /proc.
func PidCPU(pid int) (name string, cpu time.Duration, err error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// pid (comm) state ppid …: comm may hold spaces, so fields count from
	// its closing parenthesis; utime and stime are the 14th and 15th.
	open, closing := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || closing < open {
		return "", 0, fmt.Errorf("/proc/%d/stat: no (comm) in %q", pid, stat)
	}
	f := strings.Fields(string(stat[closing+1:]))
	if len(f) < 13 {
		return "", 0, fmt.Errorf("/proc/%d/stat: %d fields after comm, want at least 13", pid, len(f))
	}
	utime, uerr := strconv.ParseInt(f[11], 10, 64)
	stime, serr := strconv.ParseInt(f[12], 10, 64)
	if uerr != nil || serr != nil {
		return "", 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return string(stat[open+1 : closing]), time.Duration(utime+stime) * time.Second / clockTicks, nil
}
