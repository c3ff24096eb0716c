package io.github.redisidem.streams;

import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Map;

/**
 * One entry of the stream as the consumer read it.
 *
 * @param id the entry's id ({@code 1700000000000-0}): where it is, never its key
 * @param fields its fields in order (empty when the entry was deleted while pending)
 */
public record StreamEntry(String id, Map<String, byte[]> fields) {
    /**
     * @param id the id
     * @param fields the fields
     */
    public StreamEntry {
        fields = Collections.unmodifiableMap(fields);
    }

    /**
     * @param name a field's name
     * @return its value as UTF-8 text, or null when the entry has no such field
     */
    public String field(String name) {
        byte[] v = fields.get(name);
        return v == null ? null : new String(v, StandardCharsets.UTF_8);
    }

    /**
     * @param name a field's name
     * @return its value as it is stored, or null
     */
    public byte[] bytes(String name) {
        return fields.get(name);
    }
}
