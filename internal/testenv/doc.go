// Package testenv is test support for this repository's own tests, and
// nothing else: it is not part of oncemill's API, and may change at any
// time. It holds what the tests of several packages share: where the test
// PostgreSQL and Redis are (ONCEMILL_POSTGRES_DSN, ONCEMILL_REDIS_ADDR, or
// the development and CI defaults), a connected pool, a schema of the
// test's own, and WaitFor.
//
// An unreachable service fails the test with what to run to start it:
// these tests never skip.
package testenv
