package io.github.redisidem.streams;

import io.github.redisidem.Edition;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.Job;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import io.github.redisidem.exceptions.ServerException;
import io.github.redisidem.transport.RedisCommand;
import io.github.redisidem.transport.Transport;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * A consumer of a Redis Stream's consumer group on the library's loop
 * (docs/clients.md, "Consumers of brokers"):
 *
 * <pre>{@code
 * StreamConsumer consumer = StreamConsumer.builder(JedisTransport.of(redis), "orders", "billing")
 *         .idemOptions(IdemOptions.builder().lease(Duration.ofSeconds(30)).build())
 *         .build();
 * consumer.run((entry, job) -> charge(entry.field("body"), job.attempt()));   // until stop()
 * }</pre>
 *
 * <ul>
 * <li>New entries come with XREADGROUP; entries pending past {@code claimIdle} (their consumer died or
 *     stalled, or they were Busy or failed) are taken over with XAUTOCLAIM. While the work runs the entry's
 *     idle time is reset (XCLAIM ... JUSTID) so that no other consumer takes it over.</li>
 * <li>The key is a field of the entry ({@code idem-key}), never its id; an entry without one is a dead letter.</li>
 * <li>On the module edition DONE and XACK go in one round trip: one script runs DONE, then XACK only when DONE
 *     completed the record. On the Functions edition (a script cannot call a function), and for a replay, XACK
 *     follows DONE's answer.</li>
 * <li>Busy: left pending, its idle time set so that it comes again once the holder's lease has run out; a
 *     failure, DoneUnconfirmed, LeaseLost, NotDurable: left pending (it comes again after {@code claimIdle}).</li>
 * <li>Exhausted, Mismatch, no key: XADD to the dead-letter stream ({@code <stream>:dlq}: the entry's fields plus
 *     {@code original-stream}, {@code original-id}, {@code error}) and XACK, in one MULTI.</li>
 * <li>Nothing here trims the stream: XTRIM ... MINID below what every group has acknowledged, as for any
 *     consumer group.</li>
 * </ul>
 */
public final class StreamConsumer implements AutoCloseable {
    /** The entry's field where the default key function finds its key. */
    public static final String KEY_FIELD = "idem-key";
    private static final Duration BUSY_BLOCK = Duration.ofMillis(100);

    private final AckingTransport transport;
    private final Idem idem;
    private final String stream;
    private final byte[] streamKey;
    private final String group;
    private final String consumer;
    private final String deadLetter;
    private final Function<StreamEntry, String> key;
    private final Function<StreamEntry, byte[]> payload;
    private final int concurrency;
    private final Duration claimIdle;
    private final Duration block;
    private final Consumer<Throwable> onError;
    private final AtomicLong acknowledged = new AtomicLong();
    private final AtomicLong heldBack = new AtomicLong();
    private final AtomicLong deadLettered = new AtomicLong();
    private final Set<String> inHand = ConcurrentHashMap.newKeySet();
    private final Map<String, Job> working = new ConcurrentHashMap<>();
    private volatile boolean stopping;
    private String cursor = "0-0";
    private long lastRound = System.nanoTime() - Long.MAX_VALUE / 2;

    private StreamConsumer(Builder b) {
        this.transport = new AckingTransport(b.transport);
        this.idem = new Idem(transport, b.idemOptions);
        this.stream = b.stream;
        this.streamKey = AckingTransport.bytes(b.stream);
        this.group = b.group;
        this.consumer = b.consumer != null ? b.consumer : ManagementFactory.getRuntimeMXBean().getName();
        this.deadLetter = b.deadLetterStream != null ? b.deadLetterStream : b.stream + ":dlq";
        this.key = b.key;
        this.payload = b.payload;
        this.concurrency = b.concurrency;
        Duration lease = b.idemOptions.lease();
        this.claimIdle = b.claimIdle != null && b.claimIdle.compareTo(lease) > 0 ? b.claimIdle : lease;
        Duration half = claimIdle.dividedBy(2);
        this.block = b.block != null ? b.block : half.compareTo(Duration.ofSeconds(2)) < 0 ? half : Duration.ofSeconds(2);
        this.onError = b.onError;
        if (b.createGroup) createGroup();
    }

    /**
     * @param transport the records' server, where the stream is too ({@code JedisTransport.of(redisClient)},
     *     {@code LettuceTransport.of(...)}); the caller closes it
     * @param stream the stream
     * @param group its consumer group
     * @return a builder
     */
    public static Builder builder(Transport transport, String stream, String group) {
        return new Builder(transport, stream, group);
    }

    /** @return the consumer's Idem (its settings, {@code idem.commands()} for the records) */
    public Idem idem() {
        return idem;
    }

    /** @return this consumer's name in the group */
    public String consumer() {
        return consumer;
    }

    /** @return the counters so far */
    public StreamStats stats() {
        return new StreamStats(acknowledged.get(), heldBack.get(), deadLettered.get(), idem.stats());
    }

    /** Stop taking entries: {@link #run} returns once those in hand are settled (safe from a shutdown hook). */
    public void stop() {
        stopping = true;
    }

    /**
     * Reads and handles entries until {@link #stop()}, then lets those in hand finish and returns. What it
     * leaves pending another consumer takes over after {@code claimIdle}.
     *
     * @param handler the work for one entry
     * @throws InterruptedException when the calling thread is interrupted (the entries in hand still finish)
     */
    public void run(StreamHandler<?> handler) throws InterruptedException {
        Objects.requireNonNull(handler, "handler");
        ExecutorService pool = Executors.newFixedThreadPool(concurrency, r -> daemon(r, "idem-stream-" + consumer));
        ScheduledExecutorService toucher = Executors.newSingleThreadScheduledExecutor(r -> daemon(r, "idem-stream-touch"));
        long every = Math.max(50, claimIdle.toMillis() / 3);
        toucher.scheduleWithFixedDelay(this::touch, every, every, TimeUnit.MILLISECONDS);
        Semaphore slots = new Semaphore(concurrency);
        try {
            while (!stopping) {
                slots.acquire();
                int free = 1 + slots.drainPermits();
                List<StreamEntry> entries = List.of();
                try {
                    entries = read(free, free == concurrency);
                } catch (RuntimeException e) {
                    report(e);
                    if (!stopping) Thread.sleep(block.toMillis());
                }
                slots.release(free - entries.size());
                for (StreamEntry entry : entries) {
                    pool.execute(() -> {
                        try {
                            handle(entry, handler);
                        } catch (RuntimeException e) {
                            report(e);
                        } finally {
                            inHand.remove(entry.id());
                            slots.release();
                        }
                    });
                }
            }
        } finally {
            pool.shutdown();
            while (!pool.awaitTermination(1, TimeUnit.SECONDS)) {
                // the entries in hand finish first
            }
            toucher.shutdownNow();
        }
    }

    private static Thread daemon(Runnable r, String name) {
        Thread t = new Thread(r, name);
        t.setDaemon(true);
        return t;
    }

    /** Stops the Idem's heartbeat timer (call after {@link #run} returned); the transport is the caller's. */
    @Override
    public void close() {
        idem.close();
    }

    // -- reading ---------------------------------------------------------

    private void createGroup() {
        try {
            call("XGROUP", "CREATE", stream, group, "0", "MKSTREAM");
        } catch (ServerException e) {
            if (e.getMessage() == null || !e.getMessage().startsWith("BUSYGROUP")) throw e;
        }
    }

    /**
     * Up to n entries: those pending past claimIdle first (an XAUTOCLAIM round when one is due), else new ones.
     */
    private List<StreamEntry> read(int n, boolean idle) {
        if (System.nanoTime() - lastRound >= block.toNanos()) {
            List<?> reply = (List<?>) call("XAUTOCLAIM", stream, group, consumer, Long.toString(claimIdle.toMillis()), cursor,
                    "COUNT", Integer.toString(n));
            cursor = Entries.text(reply.get(0));
            if ("0-0".equals(cursor)) lastRound = System.nanoTime();
            List<StreamEntry> claimed = mine(Entries.parse((List<?>) reply.get(1)));
            if (!claimed.isEmpty()) return claimed;
        }
        // Always a BLOCK, so that an empty stream is never polled in a loop; a short one while entries are in
        // hand, so that a slot they free is filled soon after.
        Duration wait = idle || block.compareTo(BUSY_BLOCK) < 0 ? block : BUSY_BLOCK;
        List<String> args = new ArrayList<>(List.of("GROUP", group, consumer, "COUNT", Integer.toString(n),
                "BLOCK", Long.toString(Math.max(1, wait.toMillis())), "STREAMS", stream, ">"));
        Object reply = send(new RedisCommand("XREADGROUP", streamKey, Entries.args(args, stream, streamKey), wait, null));
        return mine(Entries.ofRead(reply));
    }

    /** The entries not in hand here already (one whose touch was late comes back to its own consumer). */
    private List<StreamEntry> mine(List<StreamEntry> entries) {
        List<StreamEntry> out = new ArrayList<>();
        for (StreamEntry e : entries) if (inHand.add(e.id())) out.add(e);
        return out;
    }

    /** Resets the idle time of the entries at work whose lease holds, keeping them this consumer's. */
    private void touch() {
        List<String> ids = new ArrayList<>();
        working.forEach((id, job) -> {
            if (!job.lost()) ids.add(id);
        });
        if (ids.isEmpty()) return;
        List<String> args = new ArrayList<>(List.of(stream, group, consumer, "0"));
        args.addAll(ids);
        args.add("JUSTID");
        try {
            send(new RedisCommand("XCLAIM", streamKey, Entries.args(args, stream, streamKey)));
        } catch (RuntimeException e) {
            report(e);
        }
    }

    // -- one entry -------------------------------------------------------

    /**
     * One entry to its end: acknowledged, held back, or dead-lettered. A command that fails leaves it pending
     * (it comes again).
     */
    void handle(StreamEntry entry, StreamHandler<?> handler) {
        if (entry.fields().isEmpty()) { // deleted from the stream while pending
            xack(entry);
            return;
        }
        Throwable error = null;
        AckingTransport.Ack ack = null;
        String recordKey = null;
        try {
            String k = key.apply(entry);
            if (k == null || k.isEmpty()) throw new MissingKeyException("entry " + entry.id() + " has no key (field " + KEY_FIELD + ")");
            if (idem.edition() == Edition.MODULE) {
                recordKey = idem.options().prefix() + k;
                ack = new AckingTransport.Ack("XACK", List.of(streamKey), List.of(AckingTransport.bytes(group), AckingTransport.bytes(entry.id())));
                if (!transport.ride(recordKey, ack)) ack = null;
            }
            byte[] p = payload == null ? null : payload.apply(entry);
            idem.process(k, p, job -> {
                working.put(entry.id(), job);
                try {
                    return handler.handle(entry, job);
                } finally {
                    working.remove(entry.id());
                }
            });
        } catch (Throwable e) {
            error = e;
        } finally {
            if (ack != null) transport.unride(recordKey, ack);
        }
        if (error == null || error instanceof ResultNotStoredException) {
            if ((ack != null && ack.ran.get()) || xack(entry)) acknowledged.incrementAndGet();
        } else if (error instanceof ExhaustedException || error instanceof MismatchException || error instanceof MissingKeyException) {
            if (deadLetter(entry, error)) deadLettered.incrementAndGet();
        } else {
            if (error instanceof BusyException busy) comeBackAfter(entry, busy.leaseLeft());
            heldBack.incrementAndGet();
        }
    }

    private boolean xack(StreamEntry entry) {
        try {
            call("XACK", stream, group, entry.id());
            return true;
        } catch (RuntimeException e) {
            report(e);
            return false;
        }
    }

    /** A Busy entry's idle time set so that XAUTOCLAIM hands it out once the holder's lease has run out. */
    private void comeBackAfter(StreamEntry entry, Duration delay) {
        long idle = Math.max(0, claimIdle.minus(delay).toMillis());
        try {
            call("XCLAIM", stream, group, consumer, "0", entry.id(), "IDLE", Long.toString(idle), "JUSTID");
        } catch (RuntimeException e) {
            report(e);
        }
    }

    /** XADD to the dead-letter stream and XACK, in one MULTI: both or neither. */
    private boolean deadLetter(StreamEntry entry, Throwable error) {
        List<String> fields = new ArrayList<>(List.of(deadLetter, "*"));
        List<byte[]> xadd = new ArrayList<>();
        for (String s : fields) xadd.add(AckingTransport.bytes(s));
        entry.fields().forEach((name, value) -> {
            xadd.add(AckingTransport.bytes(name));
            xadd.add(value);
        });
        for (String s : List.of("original-stream", stream, "original-id", entry.id(), "error", String.valueOf(error.getMessage())))
            xadd.add(AckingTransport.bytes(s));
        byte[] dlq = xadd.get(0);
        // MULTI marked as blocking (for no time) takes a connection of its own from every transport: on a shared,
        // multiplexed one (Lettuce's) another thread's command could land inside the transaction.
        List<RedisCommand> commands = List.of(
                new RedisCommand("MULTI", streamKey, List.of(), Duration.ZERO, null),
                new RedisCommand("XADD", dlq, xadd),
                new RedisCommand("XACK", streamKey, Entries.args(List.of(stream, group, entry.id()), stream, streamKey)),
                new RedisCommand("EXEC", streamKey, List.of()));
        try {
            List<Object> replies = transport.sendTogether(commands).join();
            Object exec = replies.get(3);
            if (exec instanceof Throwable t) throw t instanceof RuntimeException r ? r : new IllegalStateException(t);
            // A list of the two replies (Lettuce: its TransactionResult, an Iterable of them); nil or none: not run.
            if (!(exec instanceof Iterable<?> results)) throw new IllegalStateException("EXEC answered " + exec);
            int n = 0;
            for (Object r : results) {
                if (r instanceof Throwable t) throw t instanceof RuntimeException re ? re : new IllegalStateException(t);
                n++;
            }
            if (n != 2) throw new IllegalStateException("EXEC answered " + exec);
            return true;
        } catch (RuntimeException e) {
            report(e);
            return false;
        }
    }

    private Object call(String name, String... args) {
        List<String> list = List.of(args);
        return send(new RedisCommand(name, streamKey, Entries.args(list, stream, streamKey)));
    }

    private Object send(RedisCommand command) {
        try {
            return transport.send(command).join();
        } catch (java.util.concurrent.CompletionException e) {
            throw e.getCause() instanceof RuntimeException r ? r : e;
        }
    }

    private void report(Throwable e) {
        if (onError != null) {
            try {
                onError.accept(e);
            } catch (RuntimeException ignored) {
                // the consumer goes on either way
            }
        }
    }

    /** A StreamConsumer's settings. */
    public static final class Builder {
        private final Transport transport;
        private final String stream;
        private final String group;
        private IdemOptions idemOptions = IdemOptions.defaults();
        private String consumer;
        private String deadLetterStream;
        private Function<StreamEntry, String> key = e -> e.field(KEY_FIELD);
        private Function<StreamEntry, byte[]> payload;
        private int concurrency = 8;
        private Duration claimIdle;
        private Duration block;
        private boolean createGroup = true;
        private Consumer<Throwable> onError;

        private Builder(Transport transport, String stream, String group) {
            this.transport = Objects.requireNonNull(transport, "transport");
            this.stream = Objects.requireNonNull(stream, "stream");
            this.group = Objects.requireNonNull(group, "group");
        }

        /** @param v the Idem's settings (lease, maxTries, prefix, ...); default {@link IdemOptions#defaults()} @return this */
        public Builder idemOptions(IdemOptions v) {
            idemOptions = Objects.requireNonNull(v);
            return this;
        }

        /** @param v this consumer's name in the group; default the JVM's {@code pid@host} @return this */
        public Builder consumer(String v) {
            consumer = v;
            return this;
        }

        /** @param v the key of an entry; default its {@code idem-key} field (null or empty: a dead letter) @return this */
        public Builder key(Function<StreamEntry, String> v) {
            key = Objects.requireNonNull(v);
            return this;
        }

        /** @param v the entry's PAYLOAD (a key seen again with another one is a dead letter, Mismatch); default none @return this */
        public Builder payload(Function<StreamEntry, byte[]> v) {
            payload = v;
            return this;
        }

        /** @param v entries handled at once; default 8 @return this */
        public Builder concurrency(int v) {
            if (v < 1) throw new IllegalArgumentException("concurrency must be at least 1");
            concurrency = v;
            return this;
        }

        /** @param v how long an entry stays pending before XAUTOCLAIM takes it over; default and least the lease @return this */
        public Builder claimIdle(Duration v) {
            claimIdle = v;
            return this;
        }

        /** @param v XREADGROUP's BLOCK, and the longest between two XAUTOCLAIM rounds; default claimIdle/2, at most 2 s @return this */
        public Builder block(Duration v) {
            block = v;
            return this;
        }

        /** @param v the dead-letter stream; default {@code <stream>:dlq} (in a cluster give both one hash tag) @return this */
        public Builder deadLetterStream(String v) {
            deadLetterStream = v;
            return this;
        }

        /** @param v XGROUP CREATE ... 0 MKSTREAM when the group is missing; default true @return this */
        public Builder createGroup(boolean v) {
            createGroup = v;
            return this;
        }

        /** @param v told what the consumer could not do and will do again (a read, an XACK, a dead letter); default nothing @return this */
        public Builder onError(Consumer<Throwable> v) {
            onError = v;
            return this;
        }

        /** @return the consumer (its group made first when missing and createGroup) */
        public StreamConsumer build() {
            return new StreamConsumer(this);
        }
    }
}
