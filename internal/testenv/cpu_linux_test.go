package testenv_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
)

// TestPidCPU: this process's time from /proc/PID/stat is, to a tick or
// two, what getrusage says, and a process that has ended is an error.
func TestPidCPU(t *testing.T) {
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	self, err := testenv.ProcessCPU()
	if err != nil {
		t.Fatal(err)
	}
	name, cpu, err := testenv.PidCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if name == "" || cpu <= 0 || cpu > self+20*time.Millisecond || cpu < self-100*time.Millisecond {
		t.Errorf("PidCPU(self) = %q, %v; getrusage says %v", name, cpu, self)
	}

	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if name, cpu, err := testenv.PidCPU(cmd.Process.Pid); err == nil {
		t.Errorf("PidCPU of an ended process = %q, %v, nil; want an error", name, cpu)
	}
}
