package io.github.redisidem.kafka;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.function.UnaryOperator;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.record.TimestampType;

/**
 * The dead letter of a record, as Spring Kafka's
 * DeadLetterPublishingRecoverer writes it: to {@code <topic>-dlt} (Spring
 * Kafka 4's default name), the record's own partition, its key, value and
 * headers, and the {@code kafka_dlt-*} headers with Spring's encodings
 * (the partition a 4-byte, the offset and timestamp 8-byte big-endian
 * integers), so that Spring's tools read it.
 */
final class DeadLetters {
    /** Spring Kafka 4's default dead-letter topic of a topic. */
    static final UnaryOperator<String> DEFAULT_TOPIC = topic -> topic + "-dlt";

    private DeadLetters() {}

    static <K, V> ProducerRecord<K, V> letter(ConsumerRecord<K, V> record, Throwable cause, String group, String topic) {
        Headers headers = new RecordHeaders(record.headers().toArray());
        headers.add("kafka_dlt-original-topic", utf8(record.topic()));
        headers.add("kafka_dlt-original-partition", ByteBuffer.allocate(4).putInt(record.partition()).array());
        headers.add("kafka_dlt-original-offset", ByteBuffer.allocate(8).putLong(record.offset()).array());
        headers.add("kafka_dlt-original-timestamp", ByteBuffer.allocate(8).putLong(record.timestamp()).array());
        headers.add("kafka_dlt-original-timestamp-type",
                utf8(record.timestampType() == TimestampType.LOG_APPEND_TIME ? "LogAppendTime" : "CreateTime"));
        if (group != null && !group.isEmpty()) {
            headers.add("kafka_dlt-original-consumer-group", utf8(group));
        }
        headers.add("kafka_dlt-exception-fqcn", utf8(cause.getClass().getName()));
        if (cause.getCause() != null) {
            headers.add("kafka_dlt-exception-cause-fqcn", utf8(cause.getCause().getClass().getName()));
        }
        headers.add("kafka_dlt-exception-message", utf8(String.valueOf(cause.getMessage())));
        StringWriter trace = new StringWriter();
        cause.printStackTrace(new PrintWriter(trace));
        headers.add("kafka_dlt-exception-stacktrace", utf8(trace.toString()));
        return new ProducerRecord<>(topic, record.partition(), record.key(), record.value(), headers);
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
