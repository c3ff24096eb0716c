package io.github.redisidem;

import io.github.redisidem.exceptions.ModuleRequiredException;
import io.github.redisidem.transport.RedisCommand;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/** The commands of either edition as they go on the wire, and the checks made before sending. */
final class Wire {
    static final int MAX_BATCH = 10_000;
    /** A WAIT is sent in pieces of at most this, so that no client's command timeout (Lettuce: 60 s) cuts one. */
    static final long MAX_WAIT_MS = 30_000;
    final Edition edition;

    Wire(Edition edition) {
        this.edition = edition;
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] bytes(long n) {
        return bytes(Long.toString(n));
    }

    /** A lease or retention: whole seconds, at least 1 (the server's unit), refused before sending. */
    static Duration checkSeconds(String what, Duration d) {
        if (d == null || d.isNegative() || d.isZero() || d.getNano() != 0) {
            throw new IllegalArgumentException(what + " must be whole seconds, at least 1: " + d);
        }
        return d;
    }

    static byte[] seconds(String what, Duration d) {
        return bytes(checkSeconds(what, d).getSeconds());
    }

    /** {@code NAME value}, when there is a value. */
    private static void option(List<byte[]> args, String name, byte[] value) {
        if (value != null) {
            args.add(bytes(name));
            args.add(value);
        }
    }

    boolean module() {
        return edition == Edition.MODULE;
    }

    private RedisCommand command(String name, String fn, byte[] key, List<byte[]> rest, Duration block, Duration deadline) {
        List<byte[]> args = new ArrayList<>(rest.size() + 3);
        if (module()) {
            args.add(key);
            args.addAll(rest);
            return new RedisCommand(name, key, args, block, deadline);
        }
        args.add(bytes(fn));
        args.add(bytes(1));
        args.add(key);
        args.addAll(rest);
        return new RedisCommand("FCALL", key, args, null, deadline);
    }

    private void moduleOnly(String what) {
        if (!module()) {
            throw new ModuleRequiredException("ERR " + what + " needs the redis-idem module: the Functions edition does not have it");
        }
    }

    RedisCommand claim(String key, Duration lease, byte[] payload, Integer maxTries, String bloom, String owner, Duration wait) {
        List<byte[]> rest = new ArrayList<>(12);
        rest.add(seconds("lease", lease));
        option(rest, "PAYLOAD", payload);
        option(rest, "MAXTRIES", maxTries == null ? null : bytes(maxTries));
        if (bloom != null) moduleOnly("BLOOM");
        option(rest, "BLOOM", bloom == null ? null : bytes(bloom));
        option(rest, "OWNER", owner == null ? null : bytes(owner));
        Duration block = null;
        if (wait != null && wait.toMillis() > 0) {
            moduleOnly("WAIT");
            long ms = Math.min(wait.toMillis(), MAX_WAIT_MS);
            rest.add(bytes("WAIT"));
            rest.add(bytes(ms));
            block = Duration.ofMillis(ms);
        }
        return command("IDEM.CLAIM", "idem_claim", bytes(key), rest, block, null);
    }

    RedisCommand done(String key, String token, byte[] result, Duration retain, String bloom, Duration deadline) {
        List<byte[]> rest = new ArrayList<>(8);
        rest.add(bytes(token));
        option(rest, "RESULT", result);
        option(rest, "RETAIN", retain == null ? null : seconds("retain", retain));
        if (bloom != null) moduleOnly("BLOOM");
        option(rest, "BLOOM", bloom == null ? null : bytes(bloom));
        return command("IDEM.DONE", "idem_done", bytes(key), rest, null, deadline);
    }

    RedisCommand release(String key, String token, Duration deadline) {
        return command("IDEM.RELEASE", "idem_release", bytes(key), List.of(bytes(token)), null, deadline);
    }

    RedisCommand extend(String key, String token, Duration lease) {
        return command("IDEM.EXTEND", "idem_extend", bytes(key), List.of(bytes(token), seconds("lease", lease)), null, null);
    }

    RedisCommand get(String key) {
        return command("IDEM.GET", "idem_get", bytes(key), List.of(), null, null);
    }

    RedisCommand requeue(String key) {
        return command("IDEM.REQUEUE", "idem_requeue", bytes(key), List.of(), null, null);
    }

    RedisCommand once(String key, Duration retain) {
        return command("IDEM.ONCE", "idem_once", bytes(key), List.of(seconds("retain", retain)), null, null);
    }

    /** {@code WAIT replicas ms}, or {@code WAITAOF 1 replicas ms}: sent after a write, on its connection. */
    static RedisCommand durable(Durable d, Duration deadline) {
        long ms = d.timeout().toMillis();
        List<byte[]> args = d.fsync() ? List.of(bytes(1), bytes(d.replicas()), bytes(ms)) : List.of(bytes(d.replicas()), bytes(ms));
        return new RedisCommand(d.fsync() ? "WAITAOF" : "WAIT", null, args, d.timeout(), deadline);
    }

    /** IDEM.SCAN's options as sent after the cursor; MATCH is the stored keys' glob. */
    static List<byte[]> scanOptions(ScanOptions o, String match) {
        List<byte[]> args = new ArrayList<>();
        option(args, "MATCH", bytes(match));
        option(args, "COUNT", o.count() == null ? null : bytes(o.count()));
        option(args, "STATE", o.state() == null ? null : bytes(o.state().name().toLowerCase(Locale.ROOT)));
        option(args, "MINTRIES", o.minTries() == null ? null : bytes(o.minTries()));
        option(args, "IDLE", o.idle() == null ? null : seconds("idle", o.idle()));
        return args;
    }

    /** One scan step, sent to one node (FCALL_RO idem_scan takes no key). */
    RedisCommand scan(String cursor, List<byte[]> options) {
        List<byte[]> args = new ArrayList<>();
        if (!module()) {
            args.add(bytes("idem_scan"));
            args.add(bytes(0));
        }
        args.add(bytes(cursor));
        args.addAll(options);
        return new RedisCommand(module() ? "IDEM.SCAN" : "FCALL_RO", null, args);
    }

    RedisCommand mclaim(List<String> keys, Duration lease, List<byte[]> payloads, Integer maxTries, String bloom, String owner) {
        moduleOnly("IDEM.MCLAIM");
        List<byte[]> args = new ArrayList<>(keys.size() * (payloads == null ? 1 : 2) + 10);
        args.add(seconds("lease", lease));
        args.add(bytes(keys.size()));
        byte[] first = null;
        for (String key : keys) {
            byte[] k = bytes(key);
            if (first == null) first = k;
            args.add(k);
        }
        if (payloads != null) {
            args.add(bytes("PAYLOADS"));
            args.addAll(payloads);
        }
        option(args, "MAXTRIES", maxTries == null ? null : bytes(maxTries));
        option(args, "BLOOM", bloom == null ? null : bytes(bloom));
        option(args, "OWNER", owner == null ? null : bytes(owner));
        return new RedisCommand("IDEM.MCLAIM", first, args);
    }

    /** MDONE: results null for none, else one per key (a null one would be sent empty and stored: callers split). */
    RedisCommand mdone(List<String> keys, List<String> tokens, List<byte[]> results, Duration retain, String bloom, Duration deadline) {
        moduleOnly("IDEM.MDONE");
        List<byte[]> args = pairs(keys, tokens, results == null ? 6 : keys.size() + 7);
        if (results != null) {
            args.add(bytes("RESULTS"));
            args.addAll(results);
        }
        option(args, "RETAIN", retain == null ? null : seconds("retain", retain));
        option(args, "BLOOM", bloom == null ? null : bytes(bloom));
        return new RedisCommand("IDEM.MDONE", args.get(1), args, null, deadline);
    }

    RedisCommand mrelease(List<String> keys, List<String> tokens, Duration deadline) {
        moduleOnly("IDEM.MRELEASE");
        List<byte[]> args = pairs(keys, tokens, 0);
        return new RedisCommand("IDEM.MRELEASE", args.get(1), args, null, deadline);
    }

    /** numkeys, then key-token pairs: the routing key is the same array as the first key (args.get(1)). */
    private static List<byte[]> pairs(List<String> keys, List<String> tokens, int more) {
        List<byte[]> args = new ArrayList<>(keys.size() * 2 + 1 + more);
        args.add(bytes(keys.size()));
        for (int i = 0; i < keys.size(); i++) {
            args.add(bytes(keys.get(i)));
            args.add(bytes(tokens.get(i)));
        }
        return args;
    }

    /** A Bloom-filter command (module only): name, the filter key, then its arguments. */
    RedisCommand bloom(String name, String key, List<byte[]> rest) {
        moduleOnly(name);
        List<byte[]> args = new ArrayList<>();
        byte[] k = bytes(key);
        args.add(k);
        args.addAll(rest);
        return new RedisCommand(name, k, args);
    }
}
