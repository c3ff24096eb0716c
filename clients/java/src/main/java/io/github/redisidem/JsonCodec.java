package io.github.redisidem;

import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * Results as JSON with Jackson (an optional dependency). A replay decodes to
 * Jackson's plain types: a Map, a List, a String, a number, a Boolean.
 */
public final class JsonCodec implements Codec {
    private final ObjectMapper mapper;

    /** With a default ObjectMapper. */
    public JsonCodec() {
        this(new ObjectMapper());
    }

    /** @param mapper the mapper to encode and decode with */
    public JsonCodec(ObjectMapper mapper) {
        this.mapper = mapper;
    }

    @Override
    public byte[] encode(Object value) throws Exception {
        return mapper.writeValueAsBytes(value);
    }

    @Override
    public Object decode(byte[] bytes) throws Exception {
        return mapper.readValue(bytes, Object.class);
    }
}
