// Package sqskeys has the key generator that knows SQS: MessageID keys a
// message by its SQS MessageId, which the package's Unmarshaler keeps in the
// metadata for it. It is apart from package keygen so that keygen does not
// import an AWS client.
package sqskeys
