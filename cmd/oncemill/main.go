package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"

	"github.com/oncemill/oncemill/store"
)

// Exit codes. Kong's own code for a usage error (80) is mapped to exitUsage.
const (
	exitOK       = 0 // done
	exitError    = 1 // the store is unreachable, or the command failed
	exitUsage    = 2 // bad flags or arguments
	exitNotFound = 3 // no live record for the key
	exitRefused  = 4 // a live lease without --force, a declined confirmation, a key that changed meanwhile
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cli is the command line: the global flags, then one command.
type cli struct {
	globals

	Inspect inspectCmd `cmd:"" help:"Show one (scope, key) record: status, attempt, fencing token, lease expiry, time left, result size, cached error and the UUID of the message that claimed it last; or with --uuid, the records a message claimed last, whatever their key."`
	List    listCmd    `cmd:"" help:"List records, filtered by scope, status and age, a page at a time."`
	Stats   statsCmd   `cmd:"" help:"Count records by scope and status; the expired backlog, the oldest in-progress lease and the cleanup lag; a partitioned PostgreSQL table's partitions and their rows. Reads every record."`
	Release releaseCmd `cmd:"" help:"Free a stuck or failed key so that its next delivery runs the handler again. Fenced by the token it shows; asks first."`
	Purge   purgeCmd   `cmd:"" help:"Delete records by scope, status or age, in batches. A dry run unless --dry-run=false."`
	Migrate migrateCmd `cmd:"" help:"Create or upgrade the store's schema (PostgreSQL, MySQL); idempotent."`

	Watermark watermarkCmd `cmd:"" help:"Show, move or delete the Kafka watermarks of the watermark mode (PostgreSQL): one row per consumer group, topic and partition."`
}

// globals are the flags every command takes: which store, and how to print.
type globals struct {
	Store string `enum:"postgres,mysql,redis,tiered,file" required:"" env:"ONCEMILL_STORE" placeholder:"postgres|mysql|redis|tiered|file" help:"The store that holds the records: postgres, mysql (MySQL or MariaDB), redis, tiered (PostgreSQL with its Redis cache: uses the postgres and redis flags) or file (store/filestore: stop the worker that holds the file first)."`

	PostgresDSN    string `name:"postgres-dsn" env:"ONCEMILL_POSTGRES_DSN" default:"postgres://postgres@127.0.0.1:5432/test" placeholder:"URL" help:"PostgreSQL for --store=postgres (default ${default})."`
	PostgresSchema string `env:"ONCEMILL_POSTGRES_SCHEMA" placeholder:"NAME" help:"Schema of the records table (default: the library's, public, what postgres.Options{} uses; pass your workers' postgres.Options.Schema if they set one)."`
	PostgresTable  string `env:"ONCEMILL_POSTGRES_TABLE" default:"oncemill_records" placeholder:"NAME" help:"The records table (default ${default})."`
	PostgresLayout string `enum:"delete,partitioned" env:"ONCEMILL_POSTGRES_LAYOUT" default:"delete" placeholder:"delete|partitioned" help:"The table's layout, your workers' postgres.Options.Layout: delete (LayoutDelete, default) or partitioned (LayoutPartitioned). migrate creates or converts the table to it."`
	MySQLDSN       string `name:"mysql-dsn" env:"ONCEMILL_MYSQL_DSN" default:"root@tcp(127.0.0.1:3306)/test" placeholder:"DSN" help:"MySQL or MariaDB for --store=mysql: a go-sql-driver DSN, user:password@tcp(host:port)/database (default ${default})."`
	MySQLTable     string `name:"mysql-table" env:"ONCEMILL_MYSQL_TABLE" default:"oncemill_records" placeholder:"NAME" help:"For --store=mysql: the records table in the DSN's database, your workers' mysql.Options.Table (default ${default})."`
	RedisAddr      string `env:"ONCEMILL_REDIS_ADDR" default:"127.0.0.1:6379" placeholder:"ADDR" help:"Redis for --store=redis: host:port, or a redis:// or rediss:// URL with password and database (default ${default})."`
	RedisPrefix    string `env:"ONCEMILL_REDIS_PREFIX" default:"oncemill" placeholder:"PREFIX" help:"Prefix of the record keys in Redis (default ${default})."`
	TieredPrefix   string `env:"ONCEMILL_TIERED_PREFIX" default:"oncemill-tiered" placeholder:"PREFIX" help:"For --store=tiered: the prefix of its Redis cache and invalidations (default ${default})."`
	FilePath       string `env:"ONCEMILL_FILE_PATH" default:"oncemill.db" placeholder:"PATH" help:"For --store=file: the file store's file, as your worker's filestore.Options.Path (default ${default}). One process at a time holds it."`

	JSON bool `name:"json" help:"Print JSON instead of a table: one object for inspect, stats, release and migrate; JSON lines for list and purge."`
}

// app is what a command runs with: the parsed flags and the process's
// streams. Commands receive it from kong (Run(*app) error).
type app struct {
	ctx    context.Context
	g      *globals
	stdin  *bufio.Reader
	stdout io.Writer
	stderr io.Writer
}

// exitPanic carries kong's request to exit (after --help) out of Parse.
type exitPanic int

// run parses args (without the program name), runs the command and returns
// the process's exit code. It never calls os.Exit, so tests call it.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (code int) {
	if len(args) == 0 {
		// No command: the help, as a usage error.
		if code := run(ctx, []string{"--help"}, stdin, stderr, stderr); code != exitOK {
			return code
		}
		return exitUsage
	}
	var c cli
	parser, err := kong.New(&c,
		kong.Name("oncemill"),
		kong.Description("The operator's tool for oncemill's stores: inspect, list and count records, release a stuck key, purge, migrate, show, move and delete Kafka watermarks.\n\n"+
			"Every command takes what it works on as flags (--scope, --key). Every flag also reads the ONCEMILL_* variable shown with it. Exit codes: 0 done, 1 error, 2 usage, 3 not found, 4 refused."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitPanic(code)) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		fmt.Fprintf(stderr, "oncemill: %v\n", err)
		return exitError
	}
	defer func() {
		switch p := recover().(type) {
		case nil:
		case exitPanic:
			code = int(p)
			if code != exitOK {
				code = exitUsage
			}
		default:
			panic(p)
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "oncemill: %v\n", err)
		var perr *kong.ParseError
		if errors.As(err, &perr) && perr.Context != nil && perr.Context.Selected() != nil {
			cmd := perr.Context.Selected()
			// The positional SCOPE KEY of earlier versions: say what replaced it.
			if strings.HasPrefix(err.Error(), "unexpected argument") && hasFlag(cmd, "key") {
				fmt.Fprintf(stderr, "oncemill %s takes the scope and key as flags: --scope=SCOPE --key=KEY\n", cmd.Path())
			}
			if flag, ok := strings.CutPrefix(err.Error(), "unknown flag --"); ok {
				flag, _, _ = strings.Cut(flag, ",")
				if takers := commandsWithFlag(parser.Model.Node, flag); len(takers) > 0 {
					fmt.Fprintf(stderr, "--%s is a flag of: oncemill %s\n", flag, strings.Join(takers, ", "))
				}
			}
			fmt.Fprintf(stderr, "Run \"oncemill %s --help\" for usage.\n", cmd.Path())
		} else {
			fmt.Fprintln(stderr, "Run \"oncemill --help\" for usage.")
		}
		return exitUsage
	}
	a := &app{ctx: ctx, g: &c.globals, stdin: bufio.NewReader(stdin), stdout: stdout, stderr: stderr}
	if err := kctx.Run(a); err != nil {
		// The library's errors start with "oncemill: " already.
		fmt.Fprintln(stderr, "oncemill: "+strings.TrimPrefix(err.Error(), "oncemill: "))
		return codeOf(err)
	}
	return exitOK
}

// hasFlag reports whether cmd takes the flag --name.
func hasFlag(cmd *kong.Node, name string) bool {
	for _, f := range cmd.Flags {
		if f.Name == name {
			return true
		}
	}
	return false
}

// commandsWithFlag lists the commands under n that take the flag --name,
// so that a flag given to the wrong command is answered with the right ones.
func commandsWithFlag(n *kong.Node, name string) []string {
	var out []string
	for _, c := range n.Children {
		if c.Type != kong.CommandNode {
			continue
		}
		if hasFlag(c, name) {
			out = append(out, c.Path())
		}
		out = append(out, commandsWithFlag(c, name)...)
	}
	return out
}

// exitErr is an error with the exit code it means.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

// refused is the error of a command that chose not to change anything.
func refused(format string, args ...any) error {
	return &exitErr{code: exitRefused, err: fmt.Errorf(format, args...)}
}

// notFound is the error of a command whose key has no live record.
func notFound(format string, args ...any) error {
	return &exitErr{code: exitNotFound, err: fmt.Errorf(format, args...)}
}

// usage is the error of input that parsed but cannot be served.
func usage(format string, args ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// codeOf maps a command's error to the exit code.
func codeOf(err error) int {
	var e *exitErr
	switch {
	case errors.As(err, &e):
		return e.code
	case errors.Is(err, store.ErrNotFound):
		return exitNotFound
	}
	return exitError
}

// connectTimeout bounds connecting to the store.
const connectTimeout = 10 * time.Second
