package io.github.redisidem.streams;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The stream commands' arguments and replies, as the library's Transport carries them. */
final class Entries {
    private Entries() {}

    /** Arguments as bytes; the stream's name is the very routing-key array (a transport finds the key by identity). */
    static List<byte[]> args(List<String> args, String stream, byte[] streamKey) {
        List<byte[]> out = new ArrayList<>(args.size());
        boolean keyed = false;
        for (String a : args) {
            if (!keyed && a.equals(stream)) {
                out.add(streamKey);
                keyed = true;
            } else {
                out.add(a.getBytes(StandardCharsets.UTF_8));
            }
        }
        return out;
    }

    static String text(Object o) {
        return o instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : String.valueOf(o);
    }

    /** XREADGROUP's reply: nil, a list of [stream, entries] (RESP2), or the map's flat [stream, entries] (RESP3). */
    static List<StreamEntry> ofRead(Object reply) {
        List<StreamEntry> out = new ArrayList<>();
        if (!(reply instanceof List<?> streams) || streams.isEmpty()) return out;
        if (!(streams.get(0) instanceof List<?>)) { // RESP3: name, entries, name, entries ...
            for (int i = 1; i < streams.size(); i += 2) out.addAll(parse((List<?>) streams.get(i)));
            return out;
        }
        for (Object s : streams) out.addAll(parse((List<?>) ((List<?>) s).get(1)));
        return out;
    }

    /** [[id, [field, value, ...] or nil], ...] */
    static List<StreamEntry> parse(List<?> entries) {
        List<StreamEntry> out = new ArrayList<>();
        if (entries == null) return out;
        for (Object o : entries) {
            List<?> e = (List<?>) o;
            Map<String, byte[]> fields = new LinkedHashMap<>();
            if (e.size() > 1 && e.get(1) instanceof List<?> flat) {
                for (int i = 0; i + 1 < flat.size(); i += 2) {
                    Object v = flat.get(i + 1);
                    fields.put(text(flat.get(i)), v instanceof byte[] b ? b : text(v).getBytes(StandardCharsets.UTF_8));
                }
            }
            out.add(new StreamEntry(text(e.get(0)), fields));
        }
        return out;
    }
}
