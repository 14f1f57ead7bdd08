// Command oncemill is the operator's tool for oncemill's stores: it shows
// what the store remembers about a key, counts and lists records, frees a
// stuck or failed key so that its next delivery runs the handler again,
// deletes records in bulk, and creates the PostgreSQL schema.
//
//	oncemill --store=postgres|mysql|redis|tiered|file [connection flags] [--json] <command> [flags]
//
//	inspect --scope S --key K [--messages]  one record: status, attempt, fencing token,
//	                                    lease expiry, time left, result size, cached error,
//	                                    the UUID of the message that claimed it last
//	inspect --uuid UUID [--scope S]     the records that message claimed last, whatever
//	                                    their key (a content-hash key, say); reads every
//	                                    record: the UUID is not indexed
//	list [--scope S] [--status ST] [--older-than D] [--limit N] [--after CURSOR] [--all]
//	stats [--scope S] [--page-size N]   counts by scope and status, expired backlog,
//	                                    oldest in-progress lease, cleanup lag;
//	                                    the partitions of a partitioned table
//	release --scope S --key K [--force] [--yes]  delete the record under the token it shows
//	purge [--scope S] [--status ST] [--older-than D] [--batch N] [--dry-run=false] [--force]
//	migrate                             apply the PostgreSQL migrations
//	watermark show|move|delete          the Kafka watermarks (PostgreSQL)
//
// Every command takes what it works on as flags, none by position, so that
// an optional scope and a required one are given alike, and a key that
// starts with a dash is --key=-k.
//
// The store and its connection come from flags or, like the example
// worker, from ONCEMILL_* variables: --store (ONCEMILL_STORE),
// --postgres-dsn (ONCEMILL_POSTGRES_DSN), --postgres-schema
// (ONCEMILL_POSTGRES_SCHEMA; empty by default, which is the library's
// default schema, public, as postgres.Options{} has it), --postgres-table
// (ONCEMILL_POSTGRES_TABLE), --mysql-dsn (ONCEMILL_MYSQL_DSN, a
// go-sql-driver DSN) and --mysql-table (ONCEMILL_MYSQL_TABLE), --redis-addr (ONCEMILL_REDIS_ADDR: host:port
// or a redis:// URL), --redis-prefix (ONCEMILL_REDIS_PREFIX) and
// --file-path (ONCEMILL_FILE_PATH). A flag wins over its variable. A file
// store is opened by one process at a time: with its worker running, every
// command fails after a second, naming the file.
//
// Every command works through store.Admin (Get, List, Delete),
// so it behaves the same on every store. Record times are compared with
// the store's clock: PostgreSQL's now(), MySQL's UTC_TIMESTAMP(6), or for Redis and the file store,
// whose record times are the workers' clocks, this machine's.
//
// release and purge delete a record only under the fencing token they read
// (store.Admin's Delete takes it): a key that another delivery took or finished
// meanwhile is reported and left alone. Neither touches a live in-progress
// lease without --force. release asks y/N on standard input unless --yes;
// purge only prints what it would delete unless --dry-run=false. Both print
// every record they deleted.
//
// Output is an aligned table, or with --json one JSON object (inspect,
// stats, release, migrate) or JSON lines (list and inspect --uuid: one
// record a line; purge:
// one record a line with its "action", then a "summary" line). Durations
// are Go duration strings ("3m2s"); a negative expires_in means expired.
//
// Exit codes: 0 done; 1 error (the store unreachable or failing, input the
// store refuses); 2 usage (bad flags or arguments); 3 not found (no live
// record for the key); 4 refused (a live lease or a success without
// --force, a declined confirmation, a key that changed since it was read).
//
// docs/operations.md describes the commands and a runbook built on them.
package main
