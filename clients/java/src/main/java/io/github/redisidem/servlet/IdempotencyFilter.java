package io.github.redisidem.servlet;

import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.Outcome;
import io.github.redisidem.Stats;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.HexFormat;
import java.util.Locale;
import java.util.Objects;
import java.util.Set;

/**
 * A servlet {@link Filter} for the {@code Idempotency-Key} header
 * (docs/clients.md, "HTTP middleware"), for Spring MVC or any servlet
 * container, made with {@link #builder(Idem)}. The handler's response
 * (status, headers, cookies, redirects, body) is kept in memory, stored
 * when the handler finishes (whether or not the client is still there),
 * then sent; a repeat gets the stored response with
 * {@code Idempotent-Replayed: true}. A repeat while the first is at work
 * waits, then {@code 409} with {@code Retry-After: 1}; another method,
 * target or body under the key is {@code 422}; a handler that throws or
 * answers 5xx stores nothing (the claim is released); {@code maxTries}
 * failures are {@code 500}; {@code required} answers {@code 400} without
 * the header.
 */
public final class IdempotencyFilter implements Filter {
    private final Idem idem;
    private final String scope;
    private final Set<String> methods;
    private final boolean required;

    private IdempotencyFilter(Builder b) {
        Integer tries = b.maxTries != null ? b.maxTries : b.idem.options().maxTries() != null ? b.idem.options().maxTries() : 3;
        this.idem = b.idem.with(o -> {
            o.maxTries(tries);
            if (b.waitFor != null) o.waitFor(b.waitFor);
            if (b.lease != null) o.lease(b.lease).heartbeat(null);
            return o;
        });
        this.scope = b.scope == null || b.scope.isEmpty() ? "http:" : "http:" + b.scope + ":";
        this.methods = Set.copyOf(b.methods.stream().map(m -> m.toUpperCase(Locale.ROOT)).toList());
        this.required = b.required;
    }

    /**
     * A filter on this instance's client, with its settings ({@code lease},
     * {@code waitFor}, {@code maxTries} (else 3), {@code durable},
     * {@code owner}, the prefix) unless the builder sets them; it keeps
     * counters of its own ({@link #stats}).
     *
     * @param idem the instance
     * @return a builder: no scope, POST and PATCH, not required
     */
    public static Builder builder(Idem idem) {
        return new Builder(idem);
    }

    /** The filter's options; every one has a default. */
    public static final class Builder {
        private final Idem idem;
        private String scope;
        private Set<String> methods = Set.of("POST", "PATCH");
        private boolean required;
        private Integer maxTries;
        private Duration waitFor;
        private Duration lease;

        private Builder(Idem idem) {
            this.idem = Objects.requireNonNull(idem, "idem");
        }

        /** @param v the key's scope: {@code http:<scope>:<Idempotency-Key>} (null or empty: {@code http:<Idempotency-Key>}) @return this builder */
        public Builder scope(String v) {
            scope = v;
            return this;
        }

        /** @param v the methods it applies to (default POST, PATCH) @return this builder */
        public Builder methods(String... v) {
            methods = Set.of(v);
            return this;
        }

        /** @param v whether a request without the header is refused with 400 (default false) @return this builder */
        public Builder required(boolean v) {
            required = v;
            return this;
        }

        /** @param v failures before 500 (default: the Idem's maxTries, else 3) @return this builder */
        public Builder maxTries(int v) {
            if (v < 1) throw new IllegalArgumentException("maxTries must be at least 1: " + v);
            maxTries = v;
            return this;
        }

        /** @param v how long a repeat waits for the first (default: the Idem's waitFor) @return this builder */
        public Builder waitFor(Duration v) {
            IdemOptions.builder().waitFor(v);
            waitFor = v;
            return this;
        }

        /** @param v how long a request's claim is held between heartbeats (default: the Idem's lease) @return this builder */
        public Builder lease(Duration v) {
            IdemOptions.builder().lease(v);
            lease = v;
            return this;
        }

        /** @return the filter (its own heartbeat: {@link IdempotencyFilter#destroy} stops it) */
        public IdempotencyFilter build() {
            return new IdempotencyFilter(this);
        }
    }

    /** @return the filter's counters */
    public Stats stats() {
        return idem.stats();
    }

    /** Stops the filter's heartbeat (the client is the caller's). */
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
        String header = key(request.getHeader("Idempotency-Key"));
        if (!methods.contains(request.getMethod().toUpperCase(Locale.ROOT))) {
            chain.doFilter(req, res);
            return;
        }
        if (header == null) {
            if (required) plain(response, 400, "this request needs an Idempotency-Key header");
            else chain.doFilter(req, res);
            return;
        }
        byte[] body = request.getInputStream().readAllBytes();
        String target = request.getRequestURI() + (request.getQueryString() != null ? "?" + request.getQueryString() : "");
        byte[] payload = fingerprint(request.getMethod(), target, body).getBytes(StandardCharsets.US_ASCII);
        // Whether this request's handler ran: a NotDurable DONE without it is a replay.
        boolean[] ran = {false};
        try {
            Outcome<StoredResponse> outcome = idem.process(scope + header, payload, StoredResponse.CODEC, job -> {
                ran[0] = true;
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
        } catch (DoneUnconfirmedException e) {
            // The handler's response exists: the client gets it; the record is completed or its claim lapses.
            send(response, (StoredResponse) e.result(), false);
        } catch (NotDurableException e) {
            // DONE: this handler's response, or a replay's stored one, marked as any replay
            // (a replay with none kept: send again, as for a claim).
            if (e.stage() == NotDurableException.Stage.DONE && e.result() instanceof StoredResponse kept) {
                send(response, kept, !ran[0]);
                return;
            }
            response.setHeader("Retry-After", "1");
            plain(response, 503, "this request could not be claimed durably: send it again");
        } catch (IOException | ServletException | RuntimeException e) {
            throw e;
        } catch (Exception e) {
            throw new ServletException(e);
        }
    }

    /** The header's value without leading and trailing spaces and tabs (RFC 9110's optional whitespace); null when nothing is left. */
    static String key(String header) {
        if (header == null) return null;
        int from = 0;
        int to = header.length();
        while (from < to && (header.charAt(from) == ' ' || header.charAt(from) == '\t')) from++;
        while (to > from && (header.charAt(to - 1) == ' ' || header.charAt(to - 1) == '\t')) to--;
        return from == to ? null : header.substring(from, to);
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
}
