package redisstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
)

// crc16 is CRC-16/XMODEM written out bit by bit from the Redis Cluster
// specification, independent of the package's table-driven one.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is Redis Cluster's HASH_SLOT: the CRC16 of the hash tag (the bytes
// between the first '{' and the first '}' after it, if not empty), or of
// the whole key.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

func TestCRC16(t *testing.T) {
	t.Parallel()
	// The check value from the Redis Cluster specification.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("test crc16 = %#x, want 0x31c3", got)
	}
	for _, s := range []string{"", "123456789", "a", "{user1000}", "\x00\xff", strings.Repeat("xyz", 100)} {
		if got, want := redisstore.CRC16(s), crc16(s); got != want {
			t.Errorf("CRC16(%q) = %#x, want %#x", s, got, want)
		}
	}
}

// TestSlotTags: the tag of slot n hashes to slot n, for every slot, so a
// record lands in the slot its identity points to.
func TestSlotTags(t *testing.T) {
	t.Parallel()
	for n := range redisstore.NumSlots {
		tag := redisstore.SlotTag(n)
		if got := keySlot("{" + tag + "}"); got != n {
			t.Fatalf("tag %q of slot %d hashes to slot %d", tag, n, got)
		}
	}
}

// TestSlotTagsPinned: the key layout is stored format. Changing it makes
// every worker of the new version miss the records of the old one, so this
// test must never be edited to pass.
func TestSlotTagsPinned(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for n := range redisstore.NumSlots {
		b.WriteString(redisstore.SlotTag(n))
		b.WriteByte('\n')
	}
	if got := fmt.Sprintf("%x", sha256.Sum256([]byte(b.String()))); got != "310d5916719b3a0ad22a1c3725c8e111862ca55941e8ff28af8ce3a745e2b88c" {
		t.Errorf("slot tag table changed: sha256 %s", got)
	}
	s := newStore(t, redis.NewClient(&redis.Options{}), redisstore.Options{})
	for _, tt := range []struct{ scope, key, record string }{
		{"payments", "order-42", "oncemill:{11m}:r:8:payments:order-42"},
		{"", "k", "oncemill:{62j}:r:0::k"},
	} {
		if record := redisstore.KeysFor(s, tt.scope, tt.key); record != tt.record {
			t.Errorf("KeysFor(%q, %q) = %q; want %q", tt.scope, tt.key, record, tt.record)
		}
	}
}

// TestRecordsSpreadOverSlots: the hash tag of a record key follows the
// CRC16 of its identity, so records spread over the slots evenly, however
// their scopes and keys are spelled.
func TestRecordsSpreadOverSlots(t *testing.T) {
	t.Parallel()
	s := newStore(t, redis.NewClient(&redis.Options{}), redisstore.Options{Prefix: "app:oncemill"})
	// 4 identities per slot on average: about 98% of the slots get one.
	used := map[int]bool{}
	for i := range 4 * redisstore.NumSlots {
		record := redisstore.KeysFor(s, "orders", fmt.Sprintf("msg-%d", i))
		used[keySlot(record)] = true
	}
	if len(used) < redisstore.NumSlots*97/100 {
		t.Errorf("65536 keys used %d of 16384 slots, want at least 97%%", len(used))
	}
}

// A Redis Cluster of three masters, started from the redis-server binary for
// this test process (or ONCEMILL_REDIS_CLUSTER_ADDRS, comma-separated).
var testCluster = sync.OnceValues(startCluster)

func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	addrs, err := testCluster()
	if err != nil {
		t.Fatalf("Redis Cluster: %v", err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 4})
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(t.Context(), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatalf("Redis Cluster at %v: %v", addrs, err)
	}
	return c
}

var (
	clusterProcs []*exec.Cmd
	clusterDir   string
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range clusterProcs {
		p.Process.Kill()
		p.Wait()
	}
	if clusterDir != "" {
		os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

func startCluster() ([]string, error) {
	if a := os.Getenv("ONCEMILL_REDIS_CLUSTER_ADDRS"); a != "" {
		return strings.Split(a, ","), nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (%v): install Redis 7, or set ONCEMILL_REDIS_CLUSTER_ADDRS to a running cluster", err)
	}
	dir, err := os.MkdirTemp("", "oncemill-redis-cluster-")
	if err != nil {
		return nil, err
	}
	clusterDir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var (
		addrs   []string
		clients []*redis.Client
	)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := range 3 {
		port, err := freeClusterPort()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin,
			"--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, fmt.Sprintf("%d.log", port)))
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting %s: %w", bin, err)
		}
		clusterProcs = append(clusterProcs, cmd)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		addrs = append(addrs, addr)
		c := redis.NewClient(&redis.Options{Addr: addr})
		clients = append(clients, c)
		for c.Ping(ctx).Err() != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("cluster node %s did not start (log in %s)", addr, dir)
			}
			time.Sleep(20 * time.Millisecond)
		}
		lo, hi := i*16384/3, (i+1)*16384/3-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return nil, err
		}
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return nil, err
		}
	}
	for _, addr := range addrs[1:] {
		host, port, _ := net.SplitHostPort(addr)
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
			return nil, err
		}
	}
	for _, c := range clients {
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("cluster did not become ready: %q", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return addrs, nil
}

// freeClusterPort finds a port that is free, and whose cluster bus port
// (port + 10000) is free too.
func freeClusterPort() (int, error) {
	for range 100 {
		port := 20000 + rand.IntN(20000)
		a, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000))
		a.Close()
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port pair for a cluster node")
}

// TestClusterContract runs the contract suite on a Redis Cluster of three
// masters. The cluster refuses any script whose keys span slots (checked
// first), so the suite passing shows every script stays in one slot, and
// List walks every master.
func TestClusterContract(t *testing.T) {
	t.Parallel()
	c := clusterClient(t)
	err := c.Eval(t.Context(), "return 1", []string{"a", "b"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("the cluster ran a script over two slots (%v): it would not catch a layout error", err)
	}
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", ap), func(t *testing.T) {
			t.Parallel()
			runContract(t, c, ap)
		})
	}
}

// TestClusterKeysAreData: the tricky identities, whose braces would break a
// naive hash tag, work on a cluster, spread over its masters.
func TestClusterKeysAreData(t *testing.T) {
	t.Parallel()
	c := clusterClient(t)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	for _, id := range tricky {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: id[0], Key: id[1], LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("Begin(%q, %q) = %v, %v; want execute", id[0], id[1], res.Decision, err)
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte(id[1]), TTL: time.Minute}); err != nil {
			t.Fatalf("Complete(%q, %q): %v", id[0], id[1], err)
		}
	}
	nodes := map[string]bool{}
	for _, id := range tricky {
		rec, err := s.Get(ctx, id[0], id[1])
		if err != nil || string(rec.Result) != id[1] {
			t.Fatalf("Get(%q, %q) = %q, %v", id[0], id[1], rec.Result, err)
		}
		n, err := c.MasterForKey(ctx, redisstore.KeysFor(s, id[0], id[1]))
		if err != nil {
			t.Fatal(err)
		}
		nodes[n.Options().Addr] = true
	}
	if len(nodes) != 3 {
		t.Errorf("%d identities landed on %d masters, want all 3", len(tricky), len(nodes))
	}

	// The listing walks every master.
	page, err := s.List(ctx, store.ListRequest{Limit: 1000})
	if err != nil || len(page.Records) != len(tricky) {
		t.Fatalf("List over the cluster = %d records, %v; want %d", len(page.Records), err, len(tricky))
	}
	redisstore.AdvanceClock(s, 2*time.Minute)
	for _, id := range tricky {
		if _, err := s.Get(ctx, id[0], id[1]); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get(%q, %q) after the records' TTL = %v, want ErrNotFound", id[0], id[1], err)
		}
	}
}
