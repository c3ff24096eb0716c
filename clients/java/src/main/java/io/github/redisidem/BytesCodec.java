package io.github.redisidem;

import java.nio.charset.StandardCharsets;

/**
 * Results as they are: a {@code byte[]} stored as is, a {@code String} as
 * UTF-8; a replay is a {@code byte[]}, or a {@code String} for
 * {@code as(String.class)}.
 */
public final class BytesCodec implements Codec<Object> {
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

    @Override
    @SuppressWarnings("unchecked")
    public <U> Codec<U> as(Class<U> type) {
        if (type != String.class) return Codec.super.as(type);
        return (Codec<U>) new Codec<String>() {
            @Override
            public byte[] encode(String value) {
                return value.getBytes(StandardCharsets.UTF_8);
            }

            @Override
            public String decode(byte[] bytes) {
                return new String(bytes, StandardCharsets.UTF_8);
            }
        };
    }
}
