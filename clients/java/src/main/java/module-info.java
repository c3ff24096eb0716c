/**
 * redis-idem for Java: idempotent message consumption on Redis (the
 * redis-idem module or its Functions edition), over Jedis or Lettuce. Only
 * the API is exported; the loop's internals are not.
 */
module io.github.redisidem {
    requires static transitive redis.clients.jedis;
    requires static transitive lettuce.core;
    requires static transitive com.fasterxml.jackson.databind;
    requires static transitive jakarta.servlet;

    exports io.github.redisidem;
    exports io.github.redisidem.exceptions;
    exports io.github.redisidem.transport;
    exports io.github.redisidem.servlet;
}
