package receiver_test

import (
	"os"
	"strings"
	"testing"
)

// The README's quick start is Example's body, so that what a newcomer copies
// is compiled and run by the tests.
func TestReadmeQuickStartIsTheExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, ok := strings.Cut(string(readme), "## Quick start")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	_, quick, _ = strings.Cut(quick, "```go\n")
	quick, _, _ = strings.Cut(quick, "```")
	_, body, _ := strings.Cut(string(src), "func Example() {\n")
	body, _, _ = strings.Cut(body, "\t// Output:")
	if normalize(quick) == "" || normalize(quick) != normalize(body) {
		t.Fatalf("README.md's quick start is not receiver.Example's body; copy it again:\n%s", body)
	}
}

func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// Two things a newcomer tripped over in the README: the quick start is a
// function's body, so the README names the file that has the whole program
// (its imports and errInsufficientFunds), and the test command's fauxqs is
// an npm package, so the README says Node.js and npm are needed.
func TestReadmeSaysWhereTheWholeProgramIsAndWhatTheTestsNeed(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, _ := strings.Cut(string(readme), "## Quick start")
	intro, _, _ := strings.Cut(quick, "```go\n")
	for _, want := range []string{"(receiver/example_test.go)", "errInsufficientFunds"} {
		if !strings.Contains(intro, want) {
			t.Errorf("the README's quick start does not say where the whole program is: its introduction lacks %q", want)
		}
	}
	brokers, err := os.ReadFile("../scripts/brokers")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(brokers), "npm") && !strings.Contains(string(readme), "Node.js and npm") {
		t.Error("scripts/brokers runs npm, but the README does not say that Node.js and npm are needed")
	}
}
