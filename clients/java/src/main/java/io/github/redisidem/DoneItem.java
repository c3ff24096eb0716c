package io.github.redisidem;

/**
 * One key of {@link Idem#doneMany}.
 *
 * @param key the key (without the prefix)
 * @param token the claim's token
 * @param result the result to store, or null
 */
public record DoneItem(String key, String token, byte[] result) {}
