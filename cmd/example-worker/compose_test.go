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
