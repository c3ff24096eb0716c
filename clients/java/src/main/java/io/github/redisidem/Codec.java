package io.github.redisidem;

/**
 * How results are stored ({@code IDEM.DONE}'s {@code RESULT}) and read back
 * on a replay, for results of type {@code T}. An instance's codec
 * ({@link IdemOptions.Builder#codec}) is a {@code Codec<Object>}; a call
 * given a {@code Class<T>} or a {@link TypeRef} uses {@link #as(Class)} /
 * {@link #as(TypeRef)} of it, so that a replay is the caller's type (a
 * record, a {@code long}) as a first run is.
 *
 * @param <T> the results' type
 */
public interface Codec<T> {
    /**
     * @param value a work's result
     * @return its bytes
     * @throws Exception when it cannot be encoded (the record is completed without it)
     */
    byte[] encode(T value) throws Exception;

    /**
     * @param bytes a stored result
     * @return its value
     * @throws Exception when it cannot be decoded
     */
    T decode(byte[] bytes) throws Exception;

    /**
     * This codec for results of another type. The default decodes as this
     * codec does and checks the value is a {@code U}; {@link JsonCodec}
     * decodes into {@code U} itself.
     *
     * @param type the results' class ({@code long.class} reads as {@code Long})
     * @param <U> the results' type
     * @return the codec
     */
    default <U> Codec<U> as(Class<U> type) {
        return Typed.checked(this, Typed.boxed(type));
    }

    /**
     * As {@link #as(Class)}, for a generic type ({@code new TypeRef<List<Receipt>>() {}}).
     *
     * @param type the results' type
     * @param <U> the results' type
     * @return the codec
     */
    @SuppressWarnings("unchecked")
    default <U> Codec<U> as(TypeRef<U> type) {
        return Typed.checked(this, (Class<U>) Typed.boxed(type.rawClass()));
    }

    /** @return {@link JsonCodec#plain()} when Jackson is on the class path, else {@link BytesCodec} */
    static Codec<Object> defaultCodec() {
        try {
            Class.forName("com.fasterxml.jackson.databind.ObjectMapper", false, Codec.class.getClassLoader());
            return JsonCodec.plain();
        } catch (ClassNotFoundException | LinkageError e) {
            return new BytesCodec();
        }
    }
}
