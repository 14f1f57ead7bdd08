package oncemill_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

func ExampleConfigError() {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	_, err := receiver.New(st).
		WithPolicy(policy.Policy{LeaseDuration: 30 * time.Second, Heartbeat: 40 * time.Second}).
		Build()
	var ce *oncemill.ConfigError
	fmt.Println(errors.Is(err, oncemill.ErrInvalidConfig), errors.As(err, &ce), ce.Setting)
	// Output: true true WithPolicy(Policy.Heartbeat)
}
