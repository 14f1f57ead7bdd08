package receiver_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
)

// docs/reference.md lists every method of the builder, every field of
// Policy and Event and every Outcome: one added without a line there fails
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
		name := "Outcome"
		for word := range strings.SplitSeq(o.String(), "_") {
			name += strings.ToUpper(word[:1]) + word[1:]
		}
		if !row(name) {
			t.Errorf("docs/reference.md has no row for %s", name)
		}
		n++
	}
	if n < 11 {
		t.Errorf("%d outcomes found, want at least 11", n)
	}
}
