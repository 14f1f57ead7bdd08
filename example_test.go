package oncemill_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/policy"
)

func ExampleConfigError() {
	err := policy.Policy{LeaseDuration: 30 * time.Second, Heartbeat: 40 * time.Second}.Validate()
	var ce *oncemill.ConfigError
	fmt.Println(errors.Is(err, oncemill.ErrInvalidConfig), errors.As(err, &ce), ce.Setting)
	// Output: true true policy.Heartbeat
}
