package idemkafka

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// deadLetterTimeout bounds one dead letter's produce.
const deadLetterTimeout = 30 * time.Second

// deadLetter sends r to its topic's dead-letter topic, same partition, with
// Spring Kafka's headers (DeadLetterPublishingRecoverer's names and
// encodings: the partition a 4-byte and the offset and timestamp 8-byte
// big-endian integers), and waits for the broker's acknowledgement. The
// produce runs through the Idem under kafka-dead-letter:<topic>:<partition>:<offset>
// (as the Java adapter does): a next owner that reads the record again
// because the commit after the letter was lost finds the letter done and
// sends none.
func (c *Consumer[T]) deadLetter(p *partition, r *kgo.Record, cause error) error {
	c.mu.Lock()
	cl, group := c.cl, c.group
	c.mu.Unlock()
	headers := append([]kgo.RecordHeader(nil), r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: "kafka_dlt-original-topic", Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: "kafka_dlt-original-partition", Value: binary.BigEndian.AppendUint32(nil, uint32(r.Partition))},
		kgo.RecordHeader{Key: "kafka_dlt-original-offset", Value: binary.BigEndian.AppendUint64(nil, uint64(r.Offset))},
		kgo.RecordHeader{Key: "kafka_dlt-original-timestamp", Value: binary.BigEndian.AppendUint64(nil, uint64(r.Timestamp.UnixMilli()))},
		kgo.RecordHeader{Key: "kafka_dlt-original-timestamp-type", Value: []byte(timestampType(r))},
		kgo.RecordHeader{Key: "kafka_dlt-exception-fqcn", Value: fmt.Appendf(nil, "%T", cause)},
		kgo.RecordHeader{Key: "kafka_dlt-exception-message", Value: []byte(cause.Error())},
	)
	if group != "" {
		headers = append(headers, kgo.RecordHeader{Key: "kafka_dlt-original-consumer-group", Value: []byte(group)})
	}
	letter := &kgo.Record{Topic: c.opts.DeadLetterTopic(r.Topic), Partition: r.Partition, Key: r.Key,
		Value: r.Value, Headers: headers}
	if c.lettersErr != nil {
		return c.lettersErr
	}
	key := fmt.Sprintf("kafka-dead-letter:%s:%d:%d", r.Topic, r.Partition, r.Offset)
	_, err := idem.Process(p.ctx, c.letters, key, func(ctx context.Context, _ *idem.Job) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, deadLetterTimeout)
		defer cancel()
		return true, cl.ProduceSync(ctx, letter).FirstErr()
	})
	if err != nil {
		return fmt.Errorf("idemkafka: the dead letter of %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return nil
}

func timestampType(r *kgo.Record) string {
	if r.Attrs.TimestampType() == 1 {
		return "LogAppendTime"
	}
	return "CreateTime"
}
