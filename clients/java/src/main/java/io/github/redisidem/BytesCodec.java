package io.github.redisidem;

import java.nio.charset.StandardCharsets;

/** Results as they are: a {@code byte[]} stored as is, a String as UTF-8; a replay is a {@code byte[]}. */
public final class BytesCodec implements Codec {
    /** The codec. */
    public BytesCodec() {}

    @Override
    public byte[] encode(Object value) {
        if (value instanceof byte[] bytes) return bytes;
        if (value instanceof String text) return text.getBytes(StandardCharsets.UTF_8);
        throw new IllegalArgumentException("BytesCodec stores byte[] or String, not " + (value == null ? "null" : value.getClass().getName()));
    }

    @Override
    public Object decode(byte[] bytes) {
        return bytes;
    }
}
