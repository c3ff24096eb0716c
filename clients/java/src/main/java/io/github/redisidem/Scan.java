package io.github.redisidem;

import io.github.redisidem.transport.Transport;
import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;

/**
 * The walk behind {@link IdemCommands#scan}: IDEM.SCAN (FCALL_RO idem_scan)
 * steps on each primary in turn, each until its cursor is back to 0. One
 * step is sent when the keys of the last one are used up.
 */
final class Scan implements Iterator<String> {
    private final Wire wire;
    private final List<Transport> nodes;
    private final List<byte[]> options;
    private final String prefix;
    private final ArrayDeque<String> keys = new ArrayDeque<>();
    private int node;
    private String cursor = "0";

    Scan(Wire wire, List<Transport> nodes, List<byte[]> options, String prefix) {
        this.wire = wire;
        this.nodes = nodes;
        this.options = options;
        this.prefix = prefix;
    }

    @Override
    public boolean hasNext() {
        while (keys.isEmpty() && node < nodes.size()) {
            Object reply = Core.join(nodes.get(node).send(wire.scan(cursor, options)));
            List<?> parts = (List<?>) Replies.check(reply);
            for (Object key : (List<?>) parts.get(1)) keys.add(Replies.text(key).substring(prefix.length()));
            cursor = Replies.text(parts.get(0));
            if (cursor.equals("0")) node++;
        }
        return !keys.isEmpty();
    }

    @Override
    public String next() {
        if (!hasNext()) throw new NoSuchElementException();
        return keys.poll();
    }
}
