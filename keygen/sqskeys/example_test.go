package sqskeys_test

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/oncemill/oncemill/keygen/sqskeys"
)

// The subscriber reads messages through sqskeys.Unmarshaler
// (sqs.SubscriberConfig{Unmarshaler: sqskeys.Unmarshaler{}}), and the
// receiver keys them by their SQS MessageId.
func ExampleMessageID() {
	msg, _ := sqskeys.Unmarshaler{}.Unmarshal(&types.Message{
		MessageId: aws.String("5fea7756-0ea4-451a-a703-a558b933e274"),
		Body:      aws.String(`{"amount":100}`),
	})
	key, _ := sqskeys.MessageID().Key(msg)
	fmt.Println(key)
	// Output: 5fea7756-0ea4-451a-a703-a558b933e274
}
