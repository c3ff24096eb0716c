package io.github.redisidem.streams;

import io.github.redisidem.exceptions.ServerException;
import io.github.redisidem.transport.RedisCommand;
import io.github.redisidem.transport.Transport;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The consumer's Idem's transport: passes every command on, but sends the
 * IDEM.DONE of a record whose entry is registered ({@link #ride}) as one
 * script that runs the DONE and then, only when it completed the record,
 * the entry's XACK: both in the DONE's round trip, and never an XACK for a
 * record this worker did not complete. Module edition only (a script
 * cannot call the Functions edition's FCALL); the loop sees DONE's own
 * answer, so its decisions (confirming a resent DONE, STALE) are unchanged.
 */
final class AckingTransport implements Transport {
    /**
     * KEYS: the record's key, then the ack's keys; ARGV[1]: how many of
     * DONE's arguments follow, then those, the ack's name and arguments.
     * Answers {DONE's answer, 1 when the ack ran} or DONE's error as it is.
     */
    static final String SCRIPT = """
            local n = tonumber(ARGV[1])
            local done = redis.pcall('IDEM.DONE', KEYS[1], unpack(ARGV, 2, n + 1))
            if type(done) == 'table' and done.err then return done end
            if done % 2 == 0 then return {done, 0} end
            local ack = {ARGV[n + 2]}
            for i = 2, #KEYS do ack[#ack + 1] = KEYS[i] end
            for i = n + 3, #ARGV do ack[#ack + 1] = ARGV[i] end
            local r = redis.pcall(unpack(ack))
            if type(r) == 'table' and r.err then return {done, 0} end
            return {done, 1}""";
    static final String SHA = sha1(SCRIPT);

    /** An acknowledgement waiting for its record's DONE: {@code name keys... args...}. */
    static final class Ack {
        final List<byte[]> keys;
        final List<byte[]> args;
        final String name;
        final AtomicBoolean ran = new AtomicBoolean();

        Ack(String name, List<byte[]> keys, List<byte[]> args) {
            this.name = name;
            this.keys = keys;
            this.args = args;
        }
    }

    private final Transport inner;
    private final ConcurrentHashMap<String, Ack> riding = new ConcurrentHashMap<>();

    AckingTransport(Transport inner) {
        this.inner = inner;
    }

    /** Rides {@code ack} on {@code recordKey}'s DONE; false when another call of the key holds the place. */
    boolean ride(String recordKey, Ack ack) {
        return riding.putIfAbsent(recordKey, ack) == null;
    }

    void unride(String recordKey, Ack ack) {
        riding.remove(recordKey, ack);
    }

    private Ack ackFor(RedisCommand c) {
        if (riding.isEmpty() || !"IDEM.DONE".equals(c.name()) || c.args().isEmpty()) return null;
        return riding.get(new String(c.args().get(0), StandardCharsets.UTF_8));
    }

    /** DONE's command as the script's EVALSHA (or EVAL), routed by the record's key as DONE was. */
    private static RedisCommand script(RedisCommand done, Ack ack, boolean bySha) {
        List<byte[]> args = new ArrayList<>();
        args.add(bytes(bySha ? SHA : SCRIPT));
        args.add(bytes(Integer.toString(1 + ack.keys.size())));
        byte[] recordKey = done.args().get(0);
        args.add(recordKey);
        args.addAll(ack.keys);
        List<byte[]> doneArgs = done.args().subList(1, done.args().size());
        args.add(bytes(Integer.toString(doneArgs.size())));
        args.addAll(doneArgs);
        args.add(bytes(ack.name));
        args.addAll(ack.args);
        return new RedisCommand(bySha ? "EVALSHA" : "EVAL", recordKey, args, done.block(), done.deadline());
    }

    /** The script's answer as DONE's, noting whether the ack ran. */
    private static Object unwrap(Object reply, Ack ack) {
        if (reply instanceof List<?> pair && pair.size() == 2 && pair.get(0) instanceof Long code) {
            if (Long.valueOf(1).equals(pair.get(1))) ack.ran.set(true);
            return code;
        }
        return reply;
    }

    private static boolean noScript(Throwable e) {
        return e instanceof ServerException && e.getMessage() != null && e.getMessage().startsWith("NOSCRIPT");
    }

    @Override
    public CompletableFuture<Object> send(RedisCommand command) {
        Ack ack = ackFor(command);
        if (ack == null) return inner.send(command);
        return inner.send(script(command, ack, true))
                .handle((r, e) -> {
                    Throwable cause = e instanceof java.util.concurrent.CompletionException && e.getCause() != null ? e.getCause() : e;
                    // NOSCRIPT: not run (a restarted or new primary): the script itself, once.
                    if (cause != null && noScript(cause)) return inner.send(script(command, ack, false));
                    return cause == null ? CompletableFuture.completedFuture(r) : CompletableFuture.failedFuture(cause);
                })
                .thenCompose(f -> f)
                .thenApply(r -> unwrap(r, ack));
    }

    @Override
    public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
        Ack ack = commands.isEmpty() ? null : ackFor(commands.get(0));
        if (ack == null) return inner.sendTogether(commands);
        return together(commands, ack, true).thenCompose(replies -> {
            if (replies.get(0) instanceof Throwable t && noScript(t)) return together(commands, ack, false);
            return CompletableFuture.completedFuture(replies);
        }).thenApply(replies -> {
            List<Object> out = new ArrayList<>(replies);
            out.set(0, unwrap(out.get(0), ack));
            return out;
        });
    }

    private CompletableFuture<List<Object>> together(List<RedisCommand> commands, Ack ack, boolean bySha) {
        List<RedisCommand> sent = new ArrayList<>(commands);
        sent.set(0, script(commands.get(0), ack, bySha));
        return inner.sendTogether(sent);
    }

    @Override
    public List<Transport> primaries() {
        return inner.primaries();
    }

    @Override
    public boolean cluster() {
        return inner.cluster();
    }

    /** The transport given to the consumer is the caller's to close. */
    @Override
    public void close() {}

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static String sha1(String s) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-1").digest(bytes(s)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
