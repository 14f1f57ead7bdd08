package mysql

import (
	"strings"
	"testing"
)

// Migrate refuses MySQL, whose syntax lacks the lock-wait bound's SET
// STATEMENT, and takes MariaDB's version strings.
func TestSupportedServer(t *testing.T) {
	for _, c := range []struct {
		version string
		refused bool
	}{
		{"10.11.19-MariaDB-0+deb12u1", false},
		{"11.4.2-MariaDB", false},
		{"8.0.36", true},
		{"8.4.0-commercial", true},
	} {
		err := supportedServer(c.version)
		if (err != nil) != c.refused {
			t.Errorf("supportedServer(%q) = %v, want refused %v", c.version, err, c.refused)
		}
		if err != nil && !strings.Contains(err.Error(), c.version) {
			t.Errorf("supportedServer(%q) = %q: the error does not name the version", c.version, err)
		}
	}
}
