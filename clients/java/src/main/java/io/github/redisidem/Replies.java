package io.github.redisidem;

import io.github.redisidem.exceptions.IdemException;
import io.github.redisidem.exceptions.ServerException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.OptionalLong;

/** Replies decoded into the library's types. */
final class Replies {
    private Replies() {}

    static String text(Object o) {
        if (o == null) return null;
        if (o instanceof byte[] b) return new String(b, StandardCharsets.UTF_8);
        return o.toString();
    }

    static long integer(Object o) {
        if (o instanceof Long l) return l;
        if (o instanceof byte[] b) return Long.parseLong(text(b));
        throw new IdemException("unexpected reply, not an integer: " + o);
    }

    /** An error element of an array: throw it (transports type them with ServerException.of). */
    static Object check(Object o) {
        if (o instanceof ServerException e) throw e;
        return o;
    }

    static Claim claim(Object reply) {
        if (!(check(reply) instanceof List<?> parts) || parts.size() != 3) throw new IdemException("unexpected claim reply: " + reply);
        ClaimStatus status = ClaimStatus.valueOf(text(parts.get(0)));
        Object value = parts.get(1);
        long attempt = integer(parts.get(2));
        return switch (status) {
            case NEW, SEEN, RETRY -> new Claim(status, text(value), null, null, attempt);
            case DONE -> new Claim(status, null, (byte[]) value, null, attempt);
            case BUSY -> new Claim(status, null, null, Duration.ofMillis(integer(value)), attempt);
            default -> new Claim(status, null, null, null, attempt);
        };
    }

    static Done done(Object reply) {
        return new Done(integer(check(reply)));
    }

    static boolean flag(Object reply) {
        return integer(check(reply)) == 1;
    }

    static Map<String, Object> map(Object reply) {
        List<?> flat = (List<?>) check(reply);
        Map<String, Object> map = new HashMap<>();
        for (int i = 0; i + 1 < flat.size(); i += 2) map.put(text(flat.get(i)), flat.get(i + 1));
        return map;
    }

    static Record record(Object reply) {
        if (check(reply) == null) return null;
        Map<String, Object> f = map(reply);
        return new Record(RecordState.valueOf(text(f.get("state")).toUpperCase(Locale.ROOT)), integer(f.get("attempt")),
                Duration.ofMillis(integer(f.get("lease_ms"))), integer(f.get("pttl")), integer(f.get("claimed_at")),
                integer(f.get("done_at")), (byte[]) f.get("result"), text(f.get("fingerprint")),
                f.get("tries") == null ? OptionalLong.empty() : OptionalLong.of(integer(f.get("tries"))), text(f.get("owner")));
    }

    /** A batch reply's elements, each decoded, an error element as that key's error. */
    static <T> Reply<T> element(Object o, java.util.function.Function<Object, T> decode) {
        try {
            return new Reply<>(decode.apply(o), null);
        } catch (IdemException e) {
            return new Reply<>(null, e);
        }
    }
}
