// Package kafkapos writes and reads the key of the Kafka watermark mode: a
// store.KafkaPosition as "<topic>/<partition>/<offset>", the form of
// keygen/kafkakeys.Offset. The stage writes it (pipeline), the store reads
// it back (store/postgres).
package kafkapos

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/oncemill/oncemill/store"
)

// Key is p as the watermark mode's key.
func Key(p store.KafkaPosition) string {
	b := make([]byte, 0, len(p.Topic)+24)
	b = append(b, p.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(p.Partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, p.Offset, 10)
	return string(b)
}

// Parse reads a key written by Key. The topic may hold '/' (Kafka's do
// not); partition and offset are the last two fields. An error wraps
// store.ErrInvalidRequest.
func Parse(key string) (store.KafkaPosition, error) {
	rest, off, ok1 := cutLast(key)
	topic, part, ok2 := cutLast(rest)
	offset, err1 := strconv.ParseInt(off, 10, 64)
	partition, err2 := strconv.ParseInt(part, 10, 32)
	if !ok1 || !ok2 || topic == "" || err1 != nil || err2 != nil || offset < 0 || partition < 0 {
		return store.KafkaPosition{}, fmt.Errorf("%w: key %.80q is not a Kafka position <topic>/<partition>/<offset>", store.ErrInvalidRequest, key)
	}
	return store.KafkaPosition{Topic: topic, Partition: int32(partition), Offset: offset}, nil
}

func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
