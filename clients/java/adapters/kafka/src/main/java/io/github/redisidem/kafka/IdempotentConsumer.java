package io.github.redisidem.kafka;

import io.github.redisidem.Idem;
import io.github.redisidem.Work;
import io.github.redisidem.kafka.Decision.Verdict;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;

/**
 * A consumer-group member's poll loop that runs each record's work once per
 * key through an {@link Idem} (docs/clients.md, "Consumers of brokers").
 *
 * <ul>
 * <li>The key is the record's key (or {@link IdempotentConsumerOptions.Builder#key a function}
 * of the record), never its offset: a producer's retry gets a new one.</li>
 * <li>Offsets are committed here (give a consumer with {@code enable.auto.commit=false}), per
 * partition up to the lowest offset not yet done, every {@code commitInterval}, and before a
 * partition is revoked (after waiting up to {@code revokeWait} for the record at work on it).</li>
 * <li>A partition's records are worked on one at a time, in order; {@code workers} partitions at
 * once. The poll loop keeps polling meanwhile: {@code max.poll.interval.ms} is never exceeded.</li>
 * <li>Busy after the Idem's wait: the partition is sought back to that record and paused for the
 * holder's lease left; a failed work (released by the loop), DONE unconfirmed, a lost lease, not
 * durable: the same, for the retry delay. The other partitions go on.</li>
 * <li>Exhausted, Mismatch, a record without a key: to {@code <topic>-dlt}, same partition, with
 * Spring Kafka's {@code kafka_dlt-*} headers, confirmed by the broker; then committed.</li>
 * <li>After the poll loop was held up (the process stopped or starved), no record starts before a
 * synchronous commit confirms this member still owns its partitions.</li>
 * </ul>
 *
 * @param <K> the records' key type
 * @param <V> the records' value type
 */
public final class IdempotentConsumer<K, V> {
    /** The longest the poll loop waits for records when it has nothing to do. */
    private static final Duration POLL = Duration.ofMillis(100);
    /** A loop iteration that took longer than this means the process was held up. */
    private static final long STALL_NANOS = TimeUnit.SECONDS.toNanos(1);
    private static final Duration DEAD_LETTER_TIMEOUT = Duration.ofSeconds(30);

    private final Idem idem;
    private final Consumer<K, V> consumer;
    private final Producer<K, V> deadLetters;
    private final IdempotentConsumerOptions<K, V> options;
    private final Map<TopicPartition, PartitionState<K, V>> parts = new LinkedHashMap<>();
    private final Semaphore wake = new Semaphore(0);
    private final AtomicLong acknowledged = new AtomicLong();
    private final AtomicLong heldBack = new AtomicLong();
    private final AtomicLong deadLettered = new AtomicLong();
    private volatile boolean stopping;
    private volatile String group;
    private boolean fenced;
    private long commitAt;
    private long lastLoop = System.nanoTime();
    private ExecutorService pool;
    private RecordHandler<K, V> handler;
    private Idem deadLetterIdem;

    /**
     * @param idem the Idem the records run through
     * @param consumer the group member (a {@code group.id}, {@code enable.auto.commit=false}); used
     *     from the thread that calls {@link #run} only, and yours to close after it
     * @param deadLetters the producer of the dead letters (serializers matching the consumer's
     *     deserializers; {@code acks=all} recommended); yours to close
     * @param options the options ({@code IdempotentConsumerOptions.defaults()})
     */
    public IdempotentConsumer(Idem idem, Consumer<K, V> consumer, Producer<K, V> deadLetters,
                              IdempotentConsumerOptions<K, V> options) {
        this.idem = idem;
        this.consumer = consumer;
        this.deadLetters = deadLetters;
        this.options = options;
    }

    /** @return the Idem's counters and this consumer's */
    public KafkaStats stats() {
        return new KafkaStats(idem.stats(), acknowledged.get(), heldBack.get(), deadLettered.get());
    }

    /**
     * Stops taking records: {@link #run} returns once the records at work are done and what is
     * done is committed. Safe from any thread (a shutdown hook, a signal handler).
     */
    public void stop() {
        stopping = true;
        wake.release();
    }

    /**
     * Subscribes to the topics (with this consumer's rebalance listener), polls and settles records
     * until {@link #stop}; then lets the records at work finish and commits what is done. Close the
     * consumer after it (leaving the group).
     *
     * @param topics the topics
     * @param handler the work of each record
     */
    public void run(Collection<String> topics, RecordHandler<K, V> handler) {
        this.handler = handler;
        AtomicInteger n = new AtomicInteger();
        pool = Executors.newFixedThreadPool(options.workers(), r -> {
            Thread t = new Thread(r, "redis-idem-kafka-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        try {
            group = consumer.groupMetadata().groupId();
            consumer.subscribe(topics, new Listener());
            while (!stopping) {
                step();
            }
            while (parts.values().stream().anyMatch(p -> p.future != null)) {
                waitForWorkers(POLL);
                poll(Duration.ZERO);
                settleFinished();
            }
            commit(true, parts);
        } finally {
            pool.shutdown();
            synchronized (this) {
                if (deadLetterIdem != null) {
                    deadLetterIdem.close();
                    deadLetterIdem = null;
                }
            }
        }
    }

    // -- the poll loop ---------------------------------------------------------

    private void step() {
        if (System.nanoTime() - lastLoop > STALL_NANOS) {
            fenced = true;
        }
        long working = parts.values().stream().filter(p -> p.future != null).count();
        boolean busy = working > 0;
        if (busy) { // a worker finishing wakes it; with a worker free, new records are looked for sooner
            waitForWorkers(working >= options.workers() ? POLL : Duration.ofMillis(10));
        }
        poll(busy ? Duration.ZERO : POLL);
        settleFinished();
        resumeDue();
        if (fenced) {
            fenced = !confirm();
        }
        if (!fenced) {
            dispatch();
        }
        commit(false, parts);
        lastLoop = System.nanoTime();
    }

    private void waitForWorkers(Duration timeout) {
        try {
            wake.tryAcquire(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stop();
        }
        wake.drainPermits();
    }

    private void poll(Duration timeout) {
        ConsumerRecords<K, V> records = consumer.poll(timeout);
        for (TopicPartition tp : records.partitions()) {
            PartitionState<K, V> p = parts.get(tp);
            if (p == null) {
                continue; // not ours any more
            }
            for (ConsumerRecord<K, V> r : records.records(tp)) {
                if (r.offset() >= p.expect) { // else fetched before a seek back
                    p.expect = r.offset() + 1;
                    p.queue.addLast(r);
                }
            }
            if (p.queue.size() >= options.maxBuffered()) {
                pause(p);
            }
        }
    }

    private void dispatch() {
        long free = options.workers() - parts.values().stream().filter(p -> p.future != null).count();
        for (PartitionState<K, V> p : parts.values()) {
            if (free <= 0) {
                return;
            }
            if (p.future == null && !p.held && !p.queue.isEmpty()) {
                ConsumerRecord<K, V> r = p.queue.pollFirst();
                p.working = r;
                p.future = pool.submit(() -> {
                    try {
                        return work(r);
                    } finally {
                        wake.release();
                    }
                });
                free--;
            }
            if (p.paused && !p.held && p.queue.size() < options.maxBuffered() / 2) {
                resume(p);
            }
        }
    }

    /** In a worker thread: the record through the Idem, and its dead letter produced and confirmed. */
    private Decision work(ConsumerRecord<K, V> record) {
        Decision d = process(record);
        if (d.verdict() == Verdict.DEAD) {
            // The dead letter is itself a work run once, keyed by the record's coordinates: a member
            // whose commit after it failed (a rebalance) leaves the record to a next owner, which
            // then finds it done instead of dead-lettering it a second time.
            String letter = "kafka-dead-letter:" + record.topic() + ":" + record.partition() + ":" + record.offset();
            try {
                deadLetterIdem().process(letter, job -> deadLetters.send(DeadLetters.letter(record, d.error(), groupId(),
                        options.deadLetterTopic().apply(record.topic())))
                        .get(DEAD_LETTER_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS).offset());
            } catch (Exception e) { // not in the dead-letter topic: not done
                if (e instanceof InterruptedException) {
                    Thread.currentThread().interrupt();
                }
                report(e);
                return new Decision(Verdict.HOLD, options.retryDelay(), e);
            }
        }
        return d;
    }

    private Decision process(ConsumerRecord<K, V> record) {
        String key;
        try {
            key = options.key().apply(record);
        } catch (MissingKeyException e) {
            return new Decision(Verdict.DEAD, Duration.ZERO, e);
        } catch (RuntimeException e) {
            return new Decision(Verdict.DEAD, Duration.ZERO,
                    new MissingKeyException("the key function failed on " + where(record) + ": " + e, e));
        }
        if (key == null || key.isEmpty()) {
            return new Decision(Verdict.DEAD, Duration.ZERO,
                    new MissingKeyException("the key function answered no key for " + where(record), null));
        }
        long[] attempt = {0};
        boolean[] returned = {false};
        Work<Object> work = job -> {
            attempt[0] = job.attempt();
            Object value = handler.handle(record, job);
            returned[0] = true;
            return value;
        };
        try {
            if (options.payload() != null) {
                idem.process(key, options.payload().apply(record), work);
            } else {
                idem.process(key, work);
            }
            return Decision.ACKED;
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            return Decision.of(e, returned[0],
                    Decision.backoff(options.retryDelay(), options.maxRetryDelay(), attempt[0]), options.retryDelay());
        }
    }

    private void settleFinished() {
        for (PartitionState<K, V> p : new ArrayList<>(parts.values())) {
            if (p.future != null && p.future.isDone()) {
                apply(p, outcome(p));
            }
        }
    }

    private Decision outcome(PartitionState<K, V> p) {
        try {
            return p.future.get();
        } catch (ExecutionException e) { // an Error out of the work: released by the loop
            return new Decision(Verdict.HOLD, options.retryDelay(), e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return new Decision(Verdict.HOLD, options.retryDelay(), e);
        }
    }

    private void apply(PartitionState<K, V> p, Decision d) {
        ConsumerRecord<K, V> r = p.working;
        p.working = null;
        p.future = null;
        if (d.verdict() != Verdict.HOLD) {
            p.doneTo = r.offset() + 1;
            (d.verdict() == Verdict.ACK ? acknowledged : deadLettered).incrementAndGet();
            if (d.verdict() == Verdict.DEAD) {
                // Committed at once (Spring's commitRecovered): a member that died before its next
                // commit would have the partition's next owner dead-letter it a second time.
                commit(true, Map.of(p.tp, p));
            }
            return;
        }
        // Held back: from that record again, once the delay has passed.
        heldBack.incrementAndGet();
        p.queue.clear();
        p.expect = r.offset();
        p.doneTo = r.offset();
        p.held = true;
        p.heldUntil = System.nanoTime() + d.delay().toNanos();
        try {
            pause(p);
            consumer.seek(p.tp, r.offset());
        } catch (IllegalStateException e) {
            // the partition is going away: its next owner starts from the committed offset
        }
    }

    private void resumeDue() {
        long now = System.nanoTime();
        for (PartitionState<K, V> p : parts.values()) {
            if (p.held && now - p.heldUntil >= 0) {
                p.held = false;
                if (p.queue.size() < options.maxBuffered() / 2) {
                    resume(p);
                }
            }
        }
    }

    private void pause(PartitionState<K, V> p) {
        if (!p.paused) {
            consumer.pause(List.of(p.tp));
            p.paused = true;
        }
    }

    private void resume(PartitionState<K, V> p) {
        if (p.paused) {
            consumer.resume(List.of(p.tp));
            p.paused = false;
        }
    }

    // -- commits -----------------------------------------------------------------

    private void commit(boolean force, Map<TopicPartition, PartitionState<K, V>> which) {
        long now = System.nanoTime();
        if (!force && now - commitAt < 0) {
            return;
        }
        if (which == parts) { // a forced commit of a few partitions does not put the others' off
            commitAt = now + options.commitInterval().toNanos();
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (PartitionState<K, V> p : which.values()) {
            if (p.doneTo != null && !p.doneTo.equals(p.committed)) {
                offsets.put(p.tp, new OffsetAndMetadata(p.doneTo));
            }
        }
        if (offsets.isEmpty()) {
            return;
        }
        try {
            consumer.commitSync(offsets);
        } catch (KafkaException e) { // a rebalance, a member given up on: again later, or by the next owner
            report(e);
            return;
        }
        offsets.forEach((tp, o) -> {
            PartitionState<K, V> p = which.get(tp);
            if (p != null) {
                p.committed = o.offset();
            }
        });
    }

    /**
     * After a stall: a synchronous commit of every partition's lowest offset not done, which the
     * group coordinator refuses from a member it no longer counts (its generation is stale).
     */
    private boolean confirm() {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        Set<TopicPartition> unknown = new HashSet<>();
        for (PartitionState<K, V> p : parts.values()) {
            Long safe = p.safeOffset();
            if (safe == null) {
                unknown.add(p.tp);
            } else {
                offsets.put(p.tp, new OffsetAndMetadata(safe));
            }
        }
        try {
            if (!unknown.isEmpty()) {
                consumer.committed(unknown).forEach((tp, o) -> {
                    if (o != null) {
                        offsets.put(tp, new OffsetAndMetadata(o.offset()));
                    }
                });
            }
            if (!offsets.isEmpty()) {
                consumer.commitSync(offsets);
            }
            return true;
        } catch (KafkaException e) {
            report(e);
            return false;
        }
    }

    /** The Idem of the dead letters: the records' own, without maxTries (a failed produce is tried again). */
    private synchronized Idem deadLetterIdem() {
        if (deadLetterIdem == null) {
            deadLetterIdem = idem.with(o -> o.maxTries(null));
        }
        return deadLetterIdem;
    }

    private String groupId() {
        return group;
    }

    private void report(Exception e) {
        if (options.onError() != null) {
            try {
                options.onError().accept(e);
            } catch (RuntimeException ignored) {
                // the reporter's trouble is not the loop's
            }
        }
    }

    private static String where(ConsumerRecord<?, ?> r) {
        return r.topic() + "-" + r.partition() + "@" + r.offset();
    }

    /** Rebalances, called inside poll() on the poll thread. */
    private final class Listener implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> assigned) {
            List<TopicPartition> fresh = new ArrayList<>();
            for (TopicPartition tp : assigned) {
                if (!parts.containsKey(tp)) {
                    parts.put(tp, new PartitionState<>(tp));
                    fresh.add(tp);
                }
            }
            if (!fresh.isEmpty()) {
                consumer.resume(fresh); // a partition held back before it went and came back
            }
            fenced = false; // a fresh assignment: this member is in the group now
        }

        /** Waits a while for the records at work on these partitions, then commits what is done before they go. */
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
            Map<TopicPartition, PartitionState<K, V>> gone = take(revoked);
            long deadline = System.nanoTime() + options.revokeWait(idem).toNanos();
            for (PartitionState<K, V> p : gone.values()) {
                if (p.future == null) {
                    continue;
                }
                try {
                    Decision d = p.future.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                    if (d.verdict() != Verdict.HOLD) { // held back: nothing to do on a partition that goes
                        apply(p, d);
                    }
                } catch (TimeoutException | ExecutionException e) {
                    // still at work: its outcome is the next owner's to see (a replay)
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            commit(true, gone);
            lastLoop = System.nanoTime(); // waiting here was not a stall
        }

        /** Lost (this member was given up on): others own them; commit nothing. */
        @Override
        public void onPartitionsLost(Collection<TopicPartition> lost) {
            take(lost); // a record still at work finishes; nobody commits it here
        }

        private Map<TopicPartition, PartitionState<K, V>> take(Collection<TopicPartition> tps) {
            Map<TopicPartition, PartitionState<K, V>> gone = new HashMap<>();
            for (TopicPartition tp : tps) {
                PartitionState<K, V> p = parts.remove(tp);
                if (p != null) {
                    gone.put(tp, p);
                }
            }
            return gone;
        }
    }
}
