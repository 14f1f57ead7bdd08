package main

// No Docker engine runs where the tests run, so docker-compose.yml is
// checked by reading it: every service docs/docker.md lists is defined, and
// the worker's addresses point at services of the file, on their ports.

import (
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Command     []string          `yaml:"command"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]any    `yaml:"depends_on"`
	Profiles    []string          `yaml:"profiles"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return f
}

// The services table of docs/docker.md: rows like "| `kafka` | ... |".
var docService = regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\|")

func TestComposeDefinesEveryServiceTheDocsMention(t *testing.T) {
	f := readCompose(t)
	doc, err := os.ReadFile("../../docs/docker.md")
	if err != nil {
		t.Fatal(err)
	}
	mentioned := docService.FindAllStringSubmatch(string(doc), -1)
	if len(mentioned) < 8 {
		t.Fatalf("docs/docker.md lists %d services in its table, want the 8 of the compose file", len(mentioned))
	}
	for _, m := range mentioned {
		if _, ok := f.Services[m[1]]; !ok {
			t.Errorf("docs/docker.md mentions service %q, which docker-compose.yml does not define", m[1])
		}
	}
	// And the other way: every service is documented.
	for name := range f.Services {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("service %q is not described in docs/docker.md", name)
		}
	}
}

func TestComposeHasTheRequiredServices(t *testing.T) {
	f := readCompose(t)
	kafka := f.Services["kafka"]
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") || !strings.Contains(kafka.Environment["KAFKA_PROCESS_ROLES"], "controller") {
		t.Errorf("kafka: want the apache/kafka image in KRaft mode (KAFKA_PROCESS_ROLES with controller), got %q %v", kafka.Image, kafka.Environment)
	}
	for name, image := range map[string]string{"rabbitmq": "rabbitmq:", "postgres": "postgres:", "redis": "redis:", "jaeger": "jaegertracing/all-in-one:"} {
		if !strings.HasPrefix(f.Services[name].Image, image) {
			t.Errorf("%s: image %q, want %s...", name, f.Services[name].Image, image)
		}
	}
	if f.Services["jaeger"].Environment["COLLECTOR_OTLP_ENABLED"] != "true" {
		t.Error("jaeger: OTLP must be enabled (COLLECTOR_OTLP_ENABLED)")
	}
	if f.Services["sqs"].Build == nil {
		t.Error("sqs: want the fauxqs emulator built from integration/fauxqs")
	}
	worker := f.Services["worker"]
	if worker.Build != "." {
		t.Errorf("worker: build %v, want the repository's Dockerfile (build: .)", worker.Build)
	}
	if !contains(worker.Command, "--mode=consume") {
		t.Errorf("worker: command %q does not run the consume mode", worker.Command)
	}
	if !contains(f.Services["producer"].Entrypoint, "--mode=produce") {
		t.Errorf("producer: entrypoint %q does not run the produce mode", f.Services["producer"].Entrypoint)
	}
	for _, svc := range f.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("port %q is published on every interface; bind it to 127.0.0.1", p)
			}
		}
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "go build") || !strings.Contains(string(dockerfile), "./cmd/example-worker") ||
		strings.Count(string(dockerfile), "\nFROM ") < 1 {
		t.Error("Dockerfile: want a multi-stage build of ./cmd/example-worker")
	}
}

// Each address the worker is given names a service of the file, on the port
// that service listens on, and the worker waits for it.
func TestComposeWorkerPointsAtTheServices(t *testing.T) {
	f := readCompose(t)
	ports := map[string]string{"kafka": "9092", "rabbitmq": "5672", "sqs": "4566", "postgres": "5432", "redis": "6379", "jaeger": "4318"}
	for _, name := range []string{"worker", "producer"} {
		svc := f.Services[name]
		for variable, value := range svc.Environment {
			host, port := hostPort(t, value)
			if host == "" {
				continue // not an address
			}
			want, ok := ports[host]
			if !ok {
				t.Errorf("%s: %s=%s points at %q, which is not a service of docker-compose.yml", name, variable, value, host)
				continue
			}
			if port != want {
				t.Errorf("%s: %s=%s uses port %s; %s listens on %s", name, variable, value, port, host, want)
			}
			if _, ok := svc.DependsOn[host]; !ok && name == "worker" {
				t.Errorf("worker: %s points at %s but the worker does not depend on it", variable, host)
			}
		}
	}
	// The variables are the ones the worker reads.
	for _, variable := range []string{"ONCEMILL_KAFKA_BROKERS", "ONCEMILL_AMQP_URL", "ONCEMILL_SQS_ENDPOINT", "ONCEMILL_POSTGRES_DSN", "ONCEMILL_REDIS_ADDR", "ONCEMILL_OTLP_ENDPOINT", "ONCEMILL_HTTP_ADDR"} {
		if _, ok := f.Services["worker"].Environment[variable]; !ok {
			t.Errorf("worker: %s is not set", variable)
		}
		t.Setenv(variable, "from-env")
	}
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for variable, got := range map[string]string{
		"ONCEMILL_KAFKA_BROKERS": cfg.kafkaBrokers, "ONCEMILL_AMQP_URL": cfg.amqpURL, "ONCEMILL_SQS_ENDPOINT": cfg.sqsEndpoint,
		"ONCEMILL_POSTGRES_DSN": cfg.postgresDSN, "ONCEMILL_REDIS_ADDR": cfg.redisAddr, "ONCEMILL_OTLP_ENDPOINT": cfg.otlpEndpoint,
		"ONCEMILL_HTTP_ADDR": cfg.httpAddr,
	} {
		if got != "from-env" {
			t.Errorf("the worker does not read %s", variable)
		}
	}
}

// hostPort reads the host and port of an address-like value ("kafka:9092",
// "amqp://guest:guest@rabbitmq:5672/"); "" when the value is not one.
func hostPort(t *testing.T, v string) (string, string) {
	if strings.Contains(v, "://") {
		u, err := url.Parse(v)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		return u.Hostname(), u.Port()
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" {
		return "", ""
	}
	return host, port
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// reservedHostPorts are the host ports the machine's services and tools
// hold: the test command's PostgreSQL, Redis, RabbitMQ and Valkey (with
// RabbitMQ's epmd, Erlang distribution and management UI), and
// scripts/brokers' Kafka and fauxqs. docker compose up runs beside them.
var reservedHostPorts = map[string]string{
	"5432": "PostgreSQL", "6379": "Redis", "5672": "RabbitMQ", "6391": "Valkey (scripts/valkey)",
	"4369": "RabbitMQ's epmd", "25672": "RabbitMQ's Erlang distribution", "15672": "RabbitMQ's management UI",
	"9092": "Kafka (scripts/brokers)", "4566": "fauxqs (scripts/brokers)",
}

// publishedPorts returns the host ports each service publishes, from
// "127.0.0.1:15432:5432" (not "127.0.0.1::8080": any free port).
func publishedPorts(f composeFile) map[string][]string {
	out := map[string][]string{}
	for name, svc := range f.Services {
		for _, p := range svc.Ports {
			if parts := strings.Split(strings.TrimSuffix(p, "/tcp"), ":"); len(parts) == 3 && parts[1] != "" {
				out[name] = append(out[name], parts[1])
			}
		}
	}
	return out
}

// A docs/docker.md services row: its name and its "from the host" cell.
var docServiceRow = regexp.MustCompile("(?m)^\\| `([a-z0-9-]+)` \\|.*\\|([^|]*)\\|$")

func TestComposeHostPortsAvoidTheTestServices(t *testing.T) {
	f := readCompose(t)
	published := publishedPorts(f)
	owner := map[string]string{}
	for name, ports := range published {
		for _, p := range ports {
			if what, ok := reservedHostPorts[p]; ok {
				t.Errorf("%s: host port %s is taken where the tests run (%s); choose another", name, p, what)
			}
			if other, ok := owner[p]; ok {
				t.Errorf("%s and %s both publish host port %s", name, other, p)
			}
			owner[p] = name
		}
	}

	// docs/docker.md names each service's host ports, and no others.
	doc, err := os.ReadFile("../../docs/docker.md")
	if err != nil {
		t.Fatal(err)
	}
	hostPorts := regexp.MustCompile(`127\.0\.0\.1:(\d+)`)
	rows := 0
	for _, row := range docServiceRow.FindAllStringSubmatch(string(doc), -1) {
		if _, ok := f.Services[row[1]]; !ok {
			continue // the settings table
		}
		rows++
		var named []string
		for _, m := range hostPorts.FindAllStringSubmatch(row[2], -1) {
			named = append(named, m[1])
		}
		slices.Sort(named)
		want := slices.Sorted(slices.Values(published[row[1]]))
		if !slices.Equal(named, want) {
			t.Errorf("docs/docker.md: %s is reached from the host on %v, the file publishes %v", row[1], named, want)
		}
	}
	if rows != len(f.Services) {
		t.Errorf("docs/docker.md has %d services rows, want one per service (%d)", rows, len(f.Services))
	}

	// Its export line points a process on the host at the published ports,
	// one variable per address the worker is given.
	export := regexp.MustCompile(`(?m)^export (ONCEMILL_.*)$`).FindStringSubmatch(string(doc))
	if export == nil {
		t.Fatal("docs/docker.md: no export ONCEMILL_... line for a process on the host")
	}
	exported := map[string]string{}
	for _, kv := range strings.Fields(export[1]) {
		variable, value, _ := strings.Cut(kv, "=")
		exported[variable] = value
	}
	for variable, value := range f.Services["worker"].Environment {
		service, _ := hostPort(t, value)
		if service == "" || len(published[service]) == 0 {
			continue // not an address, or not a service reachable from the host
		}
		got, ok := exported[variable]
		if !ok {
			t.Errorf("docs/docker.md: the export line does not set %s (the worker's %s)", variable, value)
			continue
		}
		host, port := hostPort(t, got)
		if host != "127.0.0.1" || !slices.Contains(published[service], port) {
			t.Errorf("docs/docker.md: export %s=%s; %s is published on 127.0.0.1:%v", variable, got, service, published[service])
		}
	}
}
