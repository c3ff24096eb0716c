package io.github.redisidem;

import com.fasterxml.jackson.databind.JavaType;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectReader;
import com.fasterxml.jackson.databind.ObjectWriter;

/**
 * Results as JSON with Jackson (an optional dependency). {@link #plain()}
 * decodes a replay into Jackson's plain types (a {@code Map}, a
 * {@code List}, a {@code String}, a number, a {@code Boolean}); {@link #of}
 * and {@link #as} decode into the type given, as a first run returns it.
 *
 * @param <T> the results' type
 */
public final class JsonCodec<T> implements Codec<T> {
    private final ObjectMapper mapper;
    private final ObjectReader reader;
    private final ObjectWriter writer;

    private JsonCodec(ObjectMapper mapper, JavaType type) {
        this.mapper = mapper;
        this.reader = mapper.readerFor(type);
        this.writer = mapper.writer();
    }

    /** @return a codec with a default {@code ObjectMapper}, decoding to plain types */
    public static JsonCodec<Object> plain() {
        return plain(new ObjectMapper());
    }

    /**
     * @param mapper the mapper to encode and decode with
     * @return a codec decoding to plain types
     */
    public static JsonCodec<Object> plain(ObjectMapper mapper) {
        return new JsonCodec<>(mapper, mapper.constructType(Object.class));
    }

    /**
     * @param type the results' class
     * @param <T> the results' type
     * @return a codec decoding into it, with a default {@code ObjectMapper}
     */
    public static <T> JsonCodec<T> of(Class<T> type) {
        return plain().as(type);
    }

    /**
     * @param type the results' generic type
     * @param <T> the results' type
     * @return a codec decoding into it, with a default {@code ObjectMapper}
     */
    public static <T> JsonCodec<T> of(TypeRef<T> type) {
        return plain().as(type);
    }

    @Override
    public <U> JsonCodec<U> as(Class<U> type) {
        return new JsonCodec<>(mapper, mapper.constructType(type));
    }

    @Override
    public <U> JsonCodec<U> as(TypeRef<U> type) {
        return new JsonCodec<>(mapper, mapper.constructType(type.type()));
    }

    @Override
    public byte[] encode(T value) throws Exception {
        return writer.writeValueAsBytes(value);
    }

    @Override
    public T decode(byte[] bytes) throws Exception {
        return reader.readValue(bytes);
    }
}
