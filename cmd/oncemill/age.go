package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// age is how long ago a record was last written (--older-than). It takes
// what time.ParseDuration takes, and days before it ("7d", "1d12h"):
// retention is thought of in days, and Go's durations stop at hours.
type age time.Duration

func (a *age) UnmarshalText(text []byte) error {
	s := string(text)
	var days time.Duration
	if head, rest, ok := strings.Cut(s, "d"); ok {
		n, err := strconv.ParseUint(head, 10, 16)
		if err != nil {
			return fmt.Errorf("%q: want a whole number of days before the d, such as 7d or 1d12h", s)
		}
		days, s = time.Duration(n)*24*time.Hour, rest
		if s == "" {
			*a = age(days)
			return nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want a duration such as 7d, 36h or 90m", string(text))
	}
	*a = age(days + d)
	return nil
}

func (a age) String() string { return time.Duration(a).String() }
