package io.github.redisidem;

/** How results are stored (IDEM.DONE's RESULT) and read back on a replay. */
public interface Codec {
    /**
     * @param value a work's result
     * @return its bytes
     * @throws Exception when it cannot be encoded (the record is completed without it)
     */
    byte[] encode(Object value) throws Exception;

    /**
     * @param bytes a stored result
     * @return its value
     * @throws Exception when it cannot be decoded
     */
    Object decode(byte[] bytes) throws Exception;

    /** @return {@link JsonCodec} when Jackson is on the class path, else {@link BytesCodec} */
    static Codec defaultCodec() {
        try {
            Class.forName("com.fasterxml.jackson.databind.ObjectMapper", false, Codec.class.getClassLoader());
            return new JsonCodec();
        } catch (ClassNotFoundException | LinkageError e) {
            return new BytesCodec();
        }
    }
}
