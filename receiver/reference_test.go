package receiver_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
)

// docs/reference.md lists every method of the builder, every field of
// Policy and Event, every Outcome and every DeadLetterReason, and the
// WithDeadLetter doc every reason too: one added without a line there fails
// here.
func TestEventFieldsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	row := func(name string) bool { return strings.Contains(string(doc), "| `"+name+"` |") }
	for _, typ := range []reflect.Type{reflect.TypeFor[policy.Policy](), reflect.TypeFor[pipeline.Event]()} {
		for f := range typ.Fields() {
			if f.IsExported() && !row(f.Name) {
				t.Errorf("docs/reference.md has no row for %s.%s", typ.Name(), f.Name)
			}
		}
	}
	builder := reflect.TypeFor[*receiver.Builder]()
	for m := range builder.Methods() {
		if !strings.Contains(string(doc), "| `"+m.Name+"(") {
			t.Errorf("docs/reference.md has no row for Builder.%s", m.Name)
		}
	}
	n := 0
	for o := pipeline.OutcomeExecuted; o.String() != "unknown"; o++ {
		if name := "Outcome" + camelCase(o.String()); !row(name) {
			t.Errorf("docs/reference.md has no row for %s", name)
		}
		n++
	}
	if n < 11 {
		t.Errorf("%d outcomes found, want at least 11", n)
	}

	builderSrc, err := os.ReadFile("receiver.go")
	if err != nil {
		t.Fatal(err)
	}
	for name, reason := range testenv.DeadLetterReasons(t) {
		if name != "DeadLetterReason"+camelCase(reason) {
			t.Errorf("%s is %q: name each reason DeadLetterReason and its string in CamelCase, as docs/reference.md says", name, reason)
		}
		if !row(reason) {
			t.Errorf("docs/reference.md has no row for the dead-letter reason %s", reason)
		}
		if !strings.Contains(string(builderSrc), "//   - "+reason+":") {
			t.Errorf("the WithDeadLetter doc does not list the reason %s", reason)
		}
	}
}

// camelCase turns snake_case into CamelCase: executed_twice, ExecutedTwice.
func camelCase(s string) string {
	var out strings.Builder
	for word := range strings.SplitSeq(s, "_") {
		out.WriteString(strings.ToUpper(word[:1]) + word[1:])
	}
	return out.String()
}
