package io.github.redisidem.exceptions;

/**
 * An error reply of the server. Transports raise it (or put it in a reply
 * array as an element) for every error reply; the library turns the ones it
 * knows into the subclasses ({@link StaleException}, {@link WrongTypeException}, ...).
 */
public class ServerException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message the server's error text, its code first ({@code WRONGTYPE ...}) */
    public ServerException(String message) {
        super(message);
    }

    /**
     * The typed form of an error reply's text.
     *
     * @param message the server's error text
     * @return the subclass this text is, or a plain ServerException
     */
    public static ServerException of(String message) {
        String m = message == null ? "" : message;
        if (m.startsWith("STALE")) return new StaleException(m);
        if (m.startsWith("WRONGTYPE")) return new WrongTypeException(m);
        if (m.contains("larger than idem.max-result") || m.contains("proto-max-bulk-len")) return new ResultTooLargeException(m);
        if (m.contains("needs the redis-idem module")) return new ModuleRequiredException(m);
        if (m.contains("processing with a live lease")) return new LiveLeaseException(m);
        return new ServerException(m);
    }
}
