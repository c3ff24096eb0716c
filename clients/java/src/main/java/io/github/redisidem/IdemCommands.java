package io.github.redisidem;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The typed commands of either edition (the module's IDEM.* or FCALL
 * idem_*), every key under the instance's prefix, and the batch helpers
 * that split by slot and in chunks of 10,000. Errors are the typed
 * exceptions: {@link StaleException}, {@link WrongTypeException},
 * {@link ResultTooLargeException}, {@link ModuleRequiredException}.
 */
public final class IdemCommands {
    private final Core core;

    IdemCommands(Core core) {
        this.core = core;
    }

    private String k(String key) {
        return core.options.prefix() + key;
    }

    private Object send(RedisCommand command) {
        try {
            return Core.join(core.transport.send(command));
        } catch (ServerException e) {
            throw ServerException.of(e.getMessage());
        }
    }

    /**
     * IDEM.CLAIM without options.
     *
     * @param key the key
     * @param lease whole seconds
     * @return the answer
     */
    public Claim claim(String key, Duration lease) {
        return claim(key, lease, null, null, null);
    }

    /**
     * IDEM.CLAIM with its options.
     *
     * @param key the key
     * @param lease whole seconds
     * @param payload PAYLOAD, or null
     * @param maxTries MAXTRIES, or null
     * @param wait WAIT (module only; blocks up to this long), or null
     * @return the answer
     */
    public Claim claim(String key, Duration lease, byte[] payload, Integer maxTries, Duration wait) {
        return Replies.claim(send(core.wire.claim(k(key), lease, payload, maxTries, core.options.bloom(), wait)));
    }

    /**
     * IDEM.DONE.
     *
     * @param key the key
     * @param token the claim's token
     * @param result RESULT, or null
     * @param retain RETAIN, or null for the server's
     * @return 0 (already done) or 1/3/5/7 decoded
     */
    public Done done(String key, String token, byte[] result, Duration retain) {
        return Replies.done(send(core.wire.done(k(key), token, result, retain, core.options.bloom())));
    }

    /**
     * @param key the key
     * @param token the claim's token
     * @return whether the live claim was given up
     */
    public boolean release(String key, String token) {
        return Replies.flag(send(core.wire.release(k(key), token)));
    }

    /**
     * IDEM.EXTEND.
     *
     * @param key the key
     * @param token the claim's token
     * @param lease whole seconds from now
     * @throws StaleException when the token does not hold the claim
     */
    public void extend(String key, String token, Duration lease) {
        Replies.flag(send(core.wire.extend(k(key), token, lease)));
    }

    /**
     * @param key the key
     * @return the record, or null
     */
    public Record get(String key) {
        return Replies.record(send(core.wire.get(k(key))));
    }

    /**
     * Every record matching all the filters given, as keys without the
     * prefix (only keys under it are listed): IDEM.SCAN (FCALL_RO idem_scan)
     * on each primary of a cluster in turn, the server itself otherwise. The
     * stream is lazy: a scan step is sent when the last one's keys are used
     * up. A record present for the whole scan is listed at least once (SCAN's
     * guarantee: maybe more).
     *
     * @param options the filters ({@link ScanOptions#all()}: every record)
     * @return the keys
     */
    public Stream<String> scan(ScanOptions options) {
        String prefix = core.options.prefix();
        List<byte[]> args = Wire.scanOptions(options, literalGlob(prefix) + (options.match() == null ? "*" : options.match()));
        Scan walk = new Scan(core.wire, core.transport.primaries(), args, prefix);
        return StreamSupport.stream(Spliterators.spliteratorUnknownSize(walk, Spliterator.ORDERED | Spliterator.NONNULL), false);
    }

    /** A prefix as a glob that matches it as it is. */
    private static String literalGlob(String prefix) {
        return prefix.replaceAll("([*?\\[\\]\\\\])", "\\\\$1");
    }

    /**
     * IDEM.REQUEUE: gives a record's work back. It is released now, keeps
     * its attempt (the next claim is RETRY with attempt + 1) and its tries
     * restart (maxTries gives it that many more); a done record's result is dropped.
     *
     * @param key the key
     * @return true when given back, false when there is no record
     * @throws LiveLeaseException when the record is processing with a live lease
     */
    public boolean requeue(String key) {
        return Replies.flag(send(core.wire.requeue(k(key))));
    }

    /**
     * IDEM.ONCE: mark-if-absent.
     *
     * @param key the key
     * @param retain whole seconds
     * @return whether the key had no record
     */
    public boolean once(String key, Duration retain) {
        return Replies.flag(send(core.wire.once(k(key), retain)));
    }

    /**
     * The module's IDEM.MCLAIM as it is (one slot, at most 10,000 keys).
     *
     * @param keys the keys
     * @param lease whole seconds
     * @param payloads one per key, or null
     * @param maxTries MAXTRIES, or null
     * @return one answer per key
     */
    public List<Reply<Claim>> mclaim(List<String> keys, Duration lease, List<byte[]> payloads, Integer maxTries) {
        List<String> rk = keys.stream().map(this::k).toList();
        return each(send(core.wire.mclaim(rk, lease, payloads, maxTries, core.options.bloom())), Replies::claim);
    }

    /**
     * The module's IDEM.MDONE as it is: with results for every item or for none.
     *
     * @param items the items
     * @param retain RETAIN, or null
     * @return one answer per item
     */
    public List<Reply<Done>> mdone(List<DoneItem> items, Duration retain) {
        List<byte[]> results = items.stream().allMatch(i -> i.result() == null) ? null : items.stream().map(DoneItem::result).toList();
        return each(send(core.wire.mdone(items.stream().map(i -> k(i.key())).toList(),
                items.stream().map(DoneItem::token).toList(), results, retain, core.options.bloom())), Replies::done);
    }

    /**
     * The module's IDEM.MRELEASE as it is.
     *
     * @param items the items
     * @return one answer per item
     */
    public List<Reply<Boolean>> mrelease(List<ReleaseItem> items) {
        return each(send(core.wire.mrelease(items.stream().map(i -> k(i.key())).toList(),
                items.stream().map(ReleaseItem::token).toList())), Replies::flag);
    }

    private static <T> List<Reply<T>> each(Object reply, Function<Object, T> decode) {
        List<Reply<T>> out = new ArrayList<>();
        for (Object element : (List<?>) reply) out.add(Replies.element(element, decode));
        return out;
    }

    /**
     * Claims many keys: on the module one IDEM.MCLAIM per slot and 10,000
     * keys, on the Functions edition one claim per key, pipelined.
     *
     * @param keys the keys
     * @param lease whole seconds
     * @param payloads one per key, or null
     * @return one answer per key, in order; a key's error is its element's
     */
    public List<Reply<Claim>> claimMany(List<String> keys, Duration lease, List<byte[]> payloads) {
        Integer maxTries = core.options.maxTries();
        return batch(keys.size(), group -> core.wire.mclaim(pick(keys, group, this::k), lease,
                payloads == null ? null : pick(payloads, group, p -> p), maxTries, core.options.bloom()),
                i -> core.wire.claim(k(keys.get(i)), lease, payloads == null ? null : payloads.get(i), maxTries, core.options.bloom(), null),
                keys, Replies::claim);
    }

    /**
     * Completes many claims (results stored where given), split as {@link #claimMany}.
     *
     * @param items the items
     * @param retain RETAIN, or null
     * @return one answer per item, in order
     */
    public List<Reply<Done>> doneMany(List<DoneItem> items, Duration retain) {
        // MDONE's RESULTS is all or none: the items with a result and those without go in two calls.
        List<Integer> with = new ArrayList<>();
        List<Integer> without = new ArrayList<>();
        for (int i = 0; i < items.size(); i++) (items.get(i).result() != null ? with : without).add(i);
        List<Reply<Done>> out = new ArrayList<>(Collections.nCopies(items.size(), null));
        for (List<Integer> part : List.of(with, without)) {
            List<DoneItem> sub = part.stream().map(items::get).toList();
            List<Reply<Done>> replies = batch(sub.size(), group -> core.wire.mdone(pick(sub, group, i -> k(i.key())),
                    pick(sub, group, DoneItem::token), part == with ? pick(sub, group, DoneItem::result) : null, retain, core.options.bloom()),
                    i -> core.wire.done(k(sub.get(i).key()), sub.get(i).token(), sub.get(i).result(), retain, core.options.bloom()),
                    sub.stream().map(DoneItem::key).toList(), Replies::done);
            for (int j = 0; j < part.size(); j++) out.set(part.get(j), replies.get(j));
        }
        return out;
    }

    /**
     * Gives many claims back, split as {@link #claimMany}.
     *
     * @param items the items
     * @return one answer per item (true: released), in order
     */
    public List<Reply<Boolean>> releaseMany(List<ReleaseItem> items) {
        return batch(items.size(), group -> core.wire.mrelease(pick(items, group, i -> k(i.key())), pick(items, group, ReleaseItem::token)),
                i -> core.wire.release(k(items.get(i).key()), items.get(i).token()),
                items.stream().map(ReleaseItem::key).toList(), Replies::flag);
    }

    private static <A, B> List<B> pick(List<A> all, List<Integer> indices, Function<A, B> f) {
        return indices.stream().map(i -> f.apply(all.get(i))).toList();
    }

    /** One batch command per group on the module; single commands pipelined on the Functions edition. */
    private <T> List<Reply<T>> batch(int n, Function<List<Integer>, RedisCommand> grouped, Function<Integer, RedisCommand> single,
                                     List<String> keys, Function<Object, T> decode) {
        List<Reply<T>> out = new ArrayList<>(Collections.nCopies(n, null));
        if (n == 0) return out;
        if (core.wire.edition == Edition.FUNCTIONS) {
            List<RedisCommand> commands = new ArrayList<>();
            for (int i = 0; i < n; i++) commands.add(single.apply(i));
            List<Object> replies = Core.join(core.transport.sendAll(commands));
            for (int i = 0; i < n; i++) out.set(i, Replies.element(replies.get(i), decode));
            return out;
        }
        for (List<Integer> group : Slots.batches(keys.stream().map(this::k).toList(), core.transport.cluster())) {
            List<?> replies;
            try {
                replies = (List<?>) send(grouped.apply(group));
            } catch (IdemException e) {
                for (int i : group) out.set(i, new Reply<>(null, e));
                continue;
            }
            for (int j = 0; j < group.size(); j++) out.set(group.get(j), Replies.element(replies.get(j), decode));
        }
        return out;
    }

    /**
     * IDEM.BF.RESERVE (module only).
     *
     * @param key the filter key
     * @param errorRate the false-positive rate over the window
     * @param capacity the first shard's items
     */
    public void bfReserve(String key, double errorRate, long capacity) {
        send(core.wire.bloom("IDEM.BF.RESERVE", k(key), List.of(Wire.bytes(Double.toString(errorRate)), Wire.bytes(capacity))));
    }

    /**
     * @param key the filter key
     * @param item the item
     * @return whether it was new in the window
     */
    public boolean bfAdd(String key, String item) {
        return Replies.flag(send(core.wire.bloom("IDEM.BF.ADD", k(key), List.of(Wire.bytes(item)))));
    }

    /**
     * @param key the filter key
     * @param item the item
     * @return whether it may have been seen in the window
     */
    public boolean bfExists(String key, String item) {
        return Replies.flag(send(core.wire.bloom("IDEM.BF.EXISTS", k(key), List.of(Wire.bytes(item)))));
    }

    /**
     * @param key the filter key
     * @param items the items
     * @return per item, whether it was new
     */
    public List<Boolean> bfMadd(String key, List<String> items) {
        return flags(send(core.wire.bloom("IDEM.BF.MADD", k(key), items.stream().map(Wire::bytes).toList())));
    }

    /**
     * @param key the filter key
     * @param items the items
     * @return per item, whether it may have been seen
     */
    public List<Boolean> bfMexists(String key, List<String> items) {
        return flags(send(core.wire.bloom("IDEM.BF.MEXISTS", k(key), items.stream().map(Wire::bytes).toList())));
    }

    /**
     * @param key the filter key
     * @return IDEM.BF.INFO's fields (values as the server sent them), or null for no filter
     */
    public Map<String, Object> bfInfo(String key) {
        Object reply = send(core.wire.bloom("IDEM.BF.INFO", k(key), List.of()));
        return reply == null ? null : Replies.map(reply);
    }

    private static List<Boolean> flags(Object reply) {
        return ((List<?>) reply).stream().map(Replies::flag).toList();
    }
}
