package io.github.redisidem.amqp;

import io.github.redisidem.Stats;

/**
 * The listener's counters (docs/clients.md, "Consumers of brokers").
 *
 * @param acknowledged messages acknowledged (done, or a replay)
 * @param heldBack messages given back to come again (Busy, a failure, DONE unconfirmed, lease lost, NotDurable)
 * @param deadLettered messages rejected to the queue's dead-letter exchange
 * @param idem the Idem's own counters
 */
public record AmqpStats(long acknowledged, long heldBack, long deadLettered, Stats idem) {}
