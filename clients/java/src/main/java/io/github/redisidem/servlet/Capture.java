package io.github.redisidem.servlet;

import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.Cookie;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.ByteArrayOutputStream;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The handler's response, kept in memory until it is stored: status,
 * headers (redirects, cookies and date headers too) and body. Nothing
 * reaches the client before the filter sends what was stored.
 */
final class Capture extends HttpServletResponseWrapper {
    /** IMF-fixdate (RFC 9110): the date headers' format. */
    private static final DateTimeFormatter HTTP_DATE = DateTimeFormatter.ofPattern("EEE, dd MMM yyyy HH:mm:ss 'GMT'", Locale.US);
    private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    private final List<String[]> headers = new ArrayList<>();
    private int status = 200;
    private String charset;
    private PrintWriter writer;
    private int bufferSize = 8192;

    Capture(HttpServletResponse response) {
        super(response);
    }

    @Override
    public void setStatus(int sc) {
        status = sc;
    }

    @Override
    public int getStatus() {
        return status;
    }

    @Override
    public void sendError(int sc, String msg) {
        resetBuffer();
        status = sc;
        if (msg != null) bytes.writeBytes(msg.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public void sendError(int sc) {
        sendError(sc, null);
    }

    @Override
    public void sendRedirect(String location) {
        sendRedirect(location, SC_FOUND, true);
    }

    /**
     * Servlet 6.1's form (a 303, a 307, ...): declared here so that it is
     * kept under a 6.1 container too, where it overrides the wrapper's.
     *
     * @param location the Location header
     * @param sc the status
     * @param clearBuffer whether the body written so far is dropped
     */
    public void sendRedirect(String location, int sc, boolean clearBuffer) {
        if (clearBuffer) resetBuffer();
        status = sc;
        setHeader("Location", location);
    }

    /**
     * Servlet 6.1's form.
     *
     * @param location the Location header
     * @param sc the status
     */
    public void sendRedirect(String location, int sc) {
        sendRedirect(location, sc, true);
    }

    /**
     * Servlet 6.1's form.
     *
     * @param location the Location header
     * @param clearBuffer whether the body written so far is dropped
     */
    public void sendRedirect(String location, boolean clearBuffer) {
        sendRedirect(location, SC_FOUND, clearBuffer);
    }

    @Override
    public void addCookie(Cookie cookie) {
        addHeader("Set-Cookie", setCookie(cookie));
    }

    /** A cookie as its Set-Cookie header (RFC 6265): name=value, then its attributes. */
    static String setCookie(Cookie cookie) {
        StringBuilder s = new StringBuilder(cookie.getName()).append('=').append(cookie.getValue() == null ? "" : cookie.getValue());
        for (Map.Entry<String, String> a : cookie.getAttributes().entrySet()) {
            if (a.getKey().equalsIgnoreCase("Max-Age") && a.getValue().startsWith("-")) continue; // a session cookie
            s.append("; ").append(a.getKey());
            if (a.getValue() != null && !a.getValue().isEmpty()) s.append('=').append(a.getValue());
        }
        return s.toString();
    }

    @Override
    public void setHeader(String name, String value) {
        headers.removeIf(h -> h[0].equalsIgnoreCase(name));
        if (value != null) addHeader(name, value);
    }

    @Override
    public void addHeader(String name, String value) {
        if (name.equalsIgnoreCase("Content-Type")) {
            String cs = charsetOf(value);
            if (cs != null) charset = cs;
        }
        headers.add(new String[] {name, value});
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
    public void setDateHeader(String name, long date) {
        setHeader(name, HTTP_DATE.format(Instant.ofEpochMilli(date).atZone(ZoneOffset.UTC)));
    }

    @Override
    public void addDateHeader(String name, long date) {
        addHeader(name, HTTP_DATE.format(Instant.ofEpochMilli(date).atZone(ZoneOffset.UTC)));
    }

    @Override
    public boolean containsHeader(String name) {
        return headers.stream().anyMatch(h -> h[0].equalsIgnoreCase(name));
    }

    @Override
    public String getHeader(String name) {
        return headers.stream().filter(h -> h[0].equalsIgnoreCase(name)).map(h -> h[1]).findFirst().orElse(null);
    }

    @Override
    public Collection<String> getHeaders(String name) {
        return headers.stream().filter(h -> h[0].equalsIgnoreCase(name)).map(h -> h[1]).toList();
    }

    @Override
    public Collection<String> getHeaderNames() {
        LinkedHashSet<String> names = new LinkedHashSet<>();
        for (String[] h : headers) names.add(h[0]);
        return names;
    }

    private static String charsetOf(String contentType) {
        for (String part : contentType.split(";")) {
            String p = part.trim();
            if (p.regionMatches(true, 0, "charset=", 0, 8)) return p.substring(8).replace("\"", "").trim();
        }
        return null;
    }

    @Override
    public void setContentType(String type) {
        if (type == null) {
            headers.removeIf(h -> h[0].equalsIgnoreCase("Content-Type"));
            return;
        }
        if (charsetOf(type) == null && charset != null && type.toLowerCase(Locale.ROOT).startsWith("text/")) type += ";charset=" + charset;
        setHeader("Content-Type", type);
    }

    @Override
    public String getContentType() {
        return getHeader("Content-Type");
    }

    @Override
    public void setCharacterEncoding(String enc) {
        charset = enc;
        String type = getContentType();
        if (type != null && enc != null) {
            String base = type.split(";")[0].trim();
            setHeader("Content-Type", base + ";charset=" + enc);
        }
    }

    @Override
    public String getCharacterEncoding() {
        return charset != null ? charset : "ISO-8859-1";
    }

    @Override
    public void setLocale(Locale locale) {
        if (locale != null) setHeader("Content-Language", locale.toLanguageTag());
    }

    @Override
    public void setContentLength(int len) {}

    @Override
    public void setContentLengthLong(long len) {}

    @Override
    public void setBufferSize(int size) {
        bufferSize = size;
    }

    @Override
    public int getBufferSize() {
        return bufferSize;
    }

    @Override
    public boolean isCommitted() {
        return false;
    }

    @Override
    public void flushBuffer() {
        if (writer != null) writer.flush();
    }

    @Override
    public void reset() {
        resetBuffer();
        headers.clear();
        status = 200;
        charset = null;
    }

    @Override
    public void resetBuffer() {
        if (writer != null) writer.flush();
        bytes.reset();
    }

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
        if (writer == null) writer = new PrintWriter(new OutputStreamWriter(bytes, Charset.forName(getCharacterEncoding())));
        return writer;
    }

    /** What the handler answered, without the headers that are not stored. */
    StoredResponse kept() {
        if (writer != null) writer.flush();
        List<String[]> stored = new ArrayList<>();
        for (String[] h : headers) if (StoredResponse.stored(h[0])) stored.add(h);
        return new StoredResponse(status, stored, bytes.toByteArray());
    }
}
