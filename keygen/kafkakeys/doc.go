// Package kafkakeys has the key generators that know Kafka: Offset keys a
// message by its topic, partition and offset. It is apart from package
// keygen so that keygen does not import a Kafka client.
//
// Use Offset when the same record redelivered (a rebalance, a crash before
// the offset commit) is the only duplicate to catch. Duplicates that the
// producer wrote twice sit at two offsets: key those by keygen.UUID or
// keygen.ContentHash.
package kafkakeys
