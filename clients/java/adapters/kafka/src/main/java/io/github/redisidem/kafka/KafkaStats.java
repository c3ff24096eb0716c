package io.github.redisidem.kafka;

import io.github.redisidem.Stats;

/**
 * The Idem's counters and the adapter's (docs/clients.md, "Consumers of brokers").
 *
 * @param idem the library's counters
 * @param acknowledged records done (processed or replayed): their offsets committable
 * @param heldBack records given back to come again (Busy, failures, DONE unconfirmed, a lost lease, not durable)
 * @param deadLettered records produced to the dead-letter topic, then committed
 */
public record KafkaStats(Stats idem, long acknowledged, long heldBack, long deadLettered) {}
