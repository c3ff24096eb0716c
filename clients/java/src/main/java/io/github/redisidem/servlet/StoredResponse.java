package io.github.redisidem.servlet;

import io.github.redisidem.Codec;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * An HTTP response as every language's middleware stores it (docs/clients.md):
 * {@code {"v":1,"status":201,"headers":[["name","value"],...],"body":"<base64>"}},
 * without the hop-by-hop and per-transfer headers.
 *
 * @param status the status code
 * @param headers name-value pairs, in order
 * @param body the body bytes
 */
record StoredResponse(int status, List<String[]> headers, byte[] body) {
    static final Set<String> NOT_STORED = Set.of("connection", "keep-alive", "transfer-encoding", "date", "content-length");

    static boolean stored(String header) {
        return !NOT_STORED.contains(header.toLowerCase(Locale.ROOT));
    }

    /** The codec the filter stores responses with. */
    static final Codec<StoredResponse> CODEC = new Codec<>() {
        @Override
        public byte[] encode(StoredResponse value) {
            return value.json().getBytes(StandardCharsets.UTF_8);
        }

        @Override
        public StoredResponse decode(byte[] bytes) {
            return parse(new String(bytes, StandardCharsets.UTF_8));
        }
    };

    String json() {
        StringBuilder s = new StringBuilder("{\"v\":1,\"status\":").append(status).append(",\"headers\":[");
        for (int i = 0; i < headers.size(); i++) {
            if (i > 0) s.append(',');
            s.append('[').append(quote(headers.get(i)[0])).append(',').append(quote(headers.get(i)[1])).append(']');
        }
        return s.append("],\"body\":\"").append(Base64.getEncoder().encodeToString(body)).append("\"}").toString();
    }

    private static String quote(String text) {
        StringBuilder s = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') s.append('\\').append(c);
            else if (c < 0x20) s.append(String.format("\\u%04x", (int) c));
            else s.append(c);
        }
        return s.append('"').toString();
    }

    /** Reads the stored format (what any language's middleware wrote). */
    static StoredResponse parse(String json) {
        Json p = new Json(json);
        int status = 0;
        List<String[]> headers = new ArrayList<>();
        byte[] body = new byte[0];
        p.expect('{');
        while (!p.peek('}')) {
            String field = p.string();
            p.expect(':');
            switch (field) {
                case "status" -> status = (int) p.number();
                case "headers" -> {
                    p.expect('[');
                    while (!p.peek(']')) {
                        p.expect('[');
                        String name = p.string();
                        p.expect(',');
                        String value = p.string();
                        p.expect(']');
                        headers.add(new String[] {name, value});
                        p.comma();
                    }
                    p.expect(']');
                }
                case "body" -> body = Base64.getDecoder().decode(p.string());
                default -> p.number();
            }
            p.comma();
        }
        return new StoredResponse(status, headers, body);
    }

    /** Just enough JSON for the stored format. */
    private static final class Json {
        private final String s;
        private int i;

        Json(String s) {
            this.s = s;
        }

        private void space() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }

        boolean peek(char c) {
            space();
            return i < s.length() && s.charAt(i) == c;
        }

        void expect(char c) {
            space();
            if (i >= s.length() || s.charAt(i) != c) throw new IllegalArgumentException("stored response: expected " + c + " at " + i);
            i++;
        }

        void comma() {
            if (peek(',')) i++;
        }

        long number() {
            space();
            int start = i;
            while (i < s.length() && "-0123456789".indexOf(s.charAt(i)) >= 0) i++;
            return Long.parseLong(s.substring(start, i));
        }

        String string() {
            expect('"');
            StringBuilder out = new StringBuilder();
            while (s.charAt(i) != '"') {
                char c = s.charAt(i++);
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n' -> out.append('\n');
                    case 't' -> out.append('\t');
                    case 'r' -> out.append('\r');
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'u' -> {
                        out.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> out.append(e);
                }
            }
            i++;
            return out.toString();
        }
    }
}
