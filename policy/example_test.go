package policy_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/policy"
)

func ExamplePolicy_Classify() {
	errInsufficientFunds := errors.New("insufficient funds")

	p := policy.Policy{
		SuccessTTL:   7 * 24 * time.Hour,
		CachedErrors: []error{errInsufficientFunds},
	}

	fmt.Println(p.Classify(fmt.Errorf("charge: %w", errInsufficientFunds)))
	fmt.Println(p.Classify(errors.New("connection reset")))
	fmt.Println(p.Classify(policy.Cached(errors.New("amount must be positive"))))
	// Output:
	// cached
	// retryable
	// cached
}
