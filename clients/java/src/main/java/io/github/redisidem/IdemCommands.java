package io.github.redisidem;

import io.github.redisidem.exceptions.LiveLeaseException;
import io.github.redisidem.exceptions.ModuleRequiredException;
import io.github.redisidem.exceptions.ResultTooLargeException;
import io.github.redisidem.exceptions.StaleException;
import io.github.redisidem.exceptions.WrongTypeException;
import io.github.redisidem.transport.RedisCommand;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The typed commands of either edition (the module's IDEM.* or FCALL
 * idem_*), every key under the instance's prefix: the server's commands as
 * they are (no OWNER, no WAIT but the one given, no resend). The batch
 * helpers with the instance's settings are {@link Idem#claimMany},
 * {@link Idem#doneMany} and {@link Idem#releaseMany}. Errors are the typed
 * exceptions: {@link StaleException}, {@link WrongTypeException},
 * {@link ResultTooLargeException}, {@link ModuleRequiredException},
 * {@link LiveLeaseException}.
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
        return Core.join(core.transport.send(command));
    }

    /**
     * IDEM.CLAIM without options.
     *
     * @param key the key
     * @param lease whole seconds
     * @return the answer
     */
    public Claim claim(String key, Duration lease) {
        return claim(key, lease, ClaimOptions.none());
    }

    /**
     * IDEM.CLAIM with its options ({@code ClaimOptions.none().owner("worker-7")}), and the instance's BLOOM.
     *
     * @param key the key
     * @param lease whole seconds
     * @param options PAYLOAD, MAXTRIES, WAIT (module only: blocks up to this long), OWNER
     * @return the answer
     */
    public Claim claim(String key, Duration lease, ClaimOptions options) {
        return Replies.claim(send(core.wire.claim(k(key), lease, options.payload(), options.maxTries(), core.options.bloom(), options.owner(),
                options.waitFor())));
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
        return Replies.done(send(core.wire.done(k(key), token, result, retain, core.options.bloom(), null)));
    }

    /**
     * @param key the key
     * @param token the claim's token
     * @return whether the live claim was given up
     */
    public boolean release(String key, String token) {
        return Replies.flag(send(core.wire.release(k(key), token, null)));
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
     * @param options MAXTRIES and OWNER for every key (a payload or a WAIT is refused: IllegalArgumentException)
     * @return one answer per key
     */
    public List<Reply<Claim>> mclaim(List<String> keys, Duration lease, List<byte[]> payloads, ClaimOptions options) {
        if (options.payload() != null || options.waitFor() != null) throw new IllegalArgumentException("IDEM.MCLAIM takes PAYLOADS, and never WAIT");
        List<String> rk = keys.stream().map(this::k).toList();
        return each(send(core.wire.mclaim(rk, lease, payloads, options.maxTries(), core.options.bloom(), options.owner())), Replies::claim);
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
                items.stream().map(DoneItem::token).toList(), results, retain, core.options.bloom(), null)), Replies::done);
    }

    /**
     * The module's IDEM.MRELEASE as it is.
     *
     * @param items the items
     * @return one answer per item
     */
    public List<Reply<Boolean>> mrelease(List<ReleaseItem> items) {
        return each(send(core.wire.mrelease(items.stream().map(i -> k(i.key())).toList(),
                items.stream().map(ReleaseItem::token).toList(), null)), Replies::flag);
    }

    private static <T> List<Reply<T>> each(Object reply, Function<Object, T> decode) {
        List<Reply<T>> out = new ArrayList<>();
        for (Object element : (List<?>) reply) out.add(Replies.element(element, decode));
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
