package io.github.redisidem;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * A servlet {@link Filter} for the {@code Idempotency-Key} header
 * (docs/clients.md, "HTTP middleware"), for Spring MVC or any servlet
 * container. The handler's response is kept in memory, stored when the
 * handler finishes (whether or not the client is still there), then sent;
 * a repeat gets the stored response with {@code Idempotent-Replayed: true}.
 * A repeat while the first is at work waits, then {@code 409} with
 * {@code Retry-After: 1}; another method, target or body under the key is
 * {@code 422}; a handler that throws or answers 5xx stores nothing (the
 * claim is released); {@code maxTries} failures are {@code 500};
 * {@code required} answers {@code 400} without the header.
 */
public final class IdempotencyFilter implements Filter {
    private final Idem idem;
    private final String scope;
    private final Set<String> methods;
    private final boolean required;

    /**
     * The filter has an {@link Idem} of its own, with its own counters ({@link #stats}).
     *
     * @param transport the client
     * @param options the instance's settings: its prefix goes before every key, its
     *     {@code waitFor} is how long a repeat waits for the first (default 10 s); its
     *     codec is replaced by the stored-response format
     * @param scope the key's scope: {@code http:<scope>:<Idempotency-Key>}, or
     *     {@code http:<Idempotency-Key>} where it is null or empty
     * @param maxTries failures before 500 (default 3)
     * @param methods the methods it applies to (default POST, PATCH)
     * @param required whether a request without the header is refused with 400
     */
    public IdempotencyFilter(Transport transport, IdemOptions options, String scope, int maxTries, Set<String> methods, boolean required) {
        this.idem = new Idem(transport, options.withCodec(StoredResponse.CODEC).withMaxTries(maxTries));
        this.scope = scope;
        this.methods = Set.copyOf(methods.stream().map(m -> m.toUpperCase(Locale.ROOT)).toList());
        this.required = required;
    }

    /**
     * With the defaults: no prefix, no scope, wait 10 s, 3 tries, POST and PATCH, not required.
     *
     * @param transport the client
     */
    public IdempotencyFilter(Transport transport) {
        this(transport, IdemOptions.defaults(), null, 3, Set.of("POST", "PATCH"), false);
    }

    /** @return the filter's counters */
    public Stats stats() {
        return idem.stats();
    }

    /** Stops the filter's heartbeat executor (the transport is the caller's). */
    @Override
    public void destroy() {
        idem.close();
    }

    /**
     * The fingerprint sent as PAYLOAD: lowercase hex SHA-256 of {@code METHOD SP target LF body}.
     *
     * @param method the method
     * @param target the path, then {@code ?} and the raw query when there is one
     * @param body the raw body
     * @return 64 hex digits
     */
    public static String fingerprint(String method, String target, byte[] body) {
        try {
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            sha.update((method.toUpperCase(Locale.ROOT) + " " + target + "\n").getBytes(StandardCharsets.UTF_8));
            sha.update(body);
            return HexFormat.of().formatHex(sha.digest());
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A handler's 5xx: nothing stored, the claim released, the response still sent. */
    private static final class ServerError extends Exception {
        private static final long serialVersionUID = 1L;
        final transient StoredResponse response;

        ServerError(StoredResponse response) {
            super("the handler answered " + response.status());
            this.response = response;
        }
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain) throws IOException, ServletException {
        HttpServletRequest request = (HttpServletRequest) req;
        HttpServletResponse response = (HttpServletResponse) res;
        String header = request.getHeader("Idempotency-Key");
        if (!methods.contains(request.getMethod().toUpperCase(Locale.ROOT))) {
            chain.doFilter(req, res);
            return;
        }
        if (header == null || header.isBlank()) {
            if (required) plain(response, 400, "this request needs an Idempotency-Key header");
            else chain.doFilter(req, res);
            return;
        }
        byte[] body = request.getInputStream().readAllBytes();
        String target = request.getRequestURI() + (request.getQueryString() != null ? "?" + request.getQueryString() : "");
        byte[] payload = fingerprint(request.getMethod(), target, body).getBytes(StandardCharsets.US_ASCII);
        try {
            Outcome<StoredResponse> outcome = idem.process(scope == null || scope.isEmpty() ? "http:" + header.trim() : "http:" + scope + ":" + header.trim(), payload, job -> {
                Capture capture = new Capture(response);
                chain.doFilter(new Body(request, body), capture);
                StoredResponse kept = capture.kept();
                if (kept.status() >= 500) throw new ServerError(kept);
                return kept;
            });
            if (outcome.value() == null) {
                plain(response, 500, "this request was completed, but its response was not kept");
                return;
            }
            send(response, outcome.value(), outcome.replayed());
        } catch (ServerError e) {
            send(response, e.response, false);
        } catch (MismatchException e) {
            plain(response, 422, "Idempotency-Key reused with another request");
        } catch (BusyException e) {
            response.setHeader("Retry-After", "1");
            plain(response, 409, "a request with this Idempotency-Key is in progress");
        } catch (ExhaustedException e) {
            plain(response, 500, "this request failed too often: send it again with a new Idempotency-Key");
        } catch (ResultNotStoredException e) {
            send(response, (StoredResponse) e.result(), false);
        } catch (IOException | ServletException | RuntimeException e) {
            throw e;
        } catch (Exception e) {
            throw new ServletException(e);
        }
    }

    private static void send(HttpServletResponse response, StoredResponse kept, boolean replayed) throws IOException {
        if (response.isCommitted()) return;
        response.setStatus(kept.status());
        for (String[] h : kept.headers()) response.addHeader(h[0], h[1]);
        if (replayed) response.setHeader("Idempotent-Replayed", "true");
        response.setContentLength(kept.body().length);
        response.getOutputStream().write(kept.body());
    }

    private static void plain(HttpServletResponse response, int status, String text) throws IOException {
        response.setStatus(status);
        response.setContentType("text/plain; charset=utf-8");
        response.getOutputStream().write(text.getBytes(StandardCharsets.UTF_8));
    }

    /** The request with its body read once, for the handler to read again. */
    private static final class Body extends HttpServletRequestWrapper {
        private final byte[] body;

        Body(HttpServletRequest request, byte[] body) {
            super(request);
            this.body = body;
        }

        @Override
        public ServletInputStream getInputStream() {
            ByteArrayInputStream in = new ByteArrayInputStream(body);
            return new ServletInputStream() {
                @Override
                public int read() {
                    return in.read();
                }

                @Override
                public boolean isFinished() {
                    return in.available() == 0;
                }

                @Override
                public boolean isReady() {
                    return true;
                }

                @Override
                public void setReadListener(ReadListener listener) {
                    throw new UnsupportedOperationException("the body is already read");
                }
            };
        }
    }

    /** The handler's response, kept in memory until it is stored. */
    private static final class Capture extends HttpServletResponseWrapper {
        private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        private final List<String[]> headers = new ArrayList<>();
        private int status = 200;
        private PrintWriter writer;

        Capture(HttpServletResponse response) {
            super(response);
        }

        @Override
        public void setStatus(int sc) {
            status = sc;
        }

        @Override
        public void sendError(int sc, String msg) {
            status = sc;
            if (msg != null) bytes.writeBytes(msg.getBytes(StandardCharsets.UTF_8));
        }

        @Override
        public void sendError(int sc) {
            status = sc;
        }

        @Override
        public int getStatus() {
            return status;
        }

        @Override
        public void setHeader(String name, String value) {
            headers.removeIf(h -> h[0].equalsIgnoreCase(name));
            addHeader(name, value);
        }

        @Override
        public void addHeader(String name, String value) {
            if (StoredResponse.stored(name)) headers.add(new String[] {name, value});
        }

        @Override
        public void setIntHeader(String name, int value) {
            setHeader(name, Integer.toString(value));
        }

        @Override
        public void addIntHeader(String name, int value) {
            addHeader(name, Integer.toString(value));
        }

        @Override
        public void setContentType(String type) {
            setHeader("Content-Type", type);
        }

        @Override
        public String getContentType() {
            return headers.stream().filter(h -> h[0].equalsIgnoreCase("Content-Type")).map(h -> h[1]).findFirst().orElse(null);
        }

        @Override
        public void setContentLength(int len) {}

        @Override
        public void setContentLengthLong(long len) {}

        @Override
        public boolean isCommitted() {
            return false;
        }

        @Override
        public void flushBuffer() {}

        @Override
        public ServletOutputStream getOutputStream() {
            return new ServletOutputStream() {
                @Override
                public void write(int b) {
                    bytes.write(b);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    bytes.write(b, off, len);
                }

                @Override
                public boolean isReady() {
                    return true;
                }

                @Override
                public void setWriteListener(WriteListener listener) {
                    throw new UnsupportedOperationException("kept in memory");
                }
            };
        }

        @Override
        public PrintWriter getWriter() {
            if (writer == null) writer = new PrintWriter(new OutputStreamWriter(bytes, StandardCharsets.UTF_8));
            return writer;
        }

        StoredResponse kept() {
            if (writer != null) writer.flush();
            return new StoredResponse(status, headers, bytes.toByteArray());
        }
    }
}
