package io.github.redisidem;

/**
 * One key of {@link Idem#releaseMany}.
 *
 * @param key the key (without the prefix)
 * @param token the claim's token
 */
public record ReleaseItem(String key, String token) {}
