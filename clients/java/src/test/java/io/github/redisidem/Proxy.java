package io.github.redisidem;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The runner's TCP proxy between the library and the server, for cut_reply
 * and cut_request: it reads the library's commands (RESP arrays) one by
 * one and, once armed for a command, forwards it and closes the library's
 * connection before the reply can reach it (cut_reply), or closes it
 * without forwarding it (cut_request); then it goes on accepting, so that
 * the library reconnects.
 */
final class Proxy implements AutoCloseable {
    private final ServerSocket listener;
    private final int upstream;
    private volatile String command;
    private volatile boolean forward;
    /** Cuts left: -1 for every time until the case ends. */
    private final AtomicInteger left = new AtomicInteger();
    /** The server unreachable: once {@code blackhole} is seen, nothing more goes either way, on any connection. */
    private volatile String blackhole;
    private volatile boolean dark;
    private final java.util.Map<String, AtomicInteger> seen = new java.util.concurrent.ConcurrentHashMap<>();

    Proxy(int upstream) throws IOException {
        this.upstream = upstream;
        this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread t = new Thread(this::accept, "proxy");
        t.setDaemon(true);
        t.start();
    }

    int port() {
        return listener.getLocalPort();
    }

    /**
     * @param name the step's command name ({@code claim}, {@code done}, {@code release}, {@code mdone}, {@code mrelease})
     * @param forward whether the command reaches the server (cut_reply) or not (cut_request)
     * @param times how many times, -1: every time
     */
    void arm(String name, boolean forward, int times) {
        this.command = name;
        this.forward = forward;
        left.set(times);
    }

    /** From the next {@code name} command on, the server is unreachable (the bytes are read and dropped both ways). */
    void blackholeFrom(String name) {
        blackhole = name;
    }

    /** @return how many {@code name} commands ({@code done}, ...) the library sent through the proxy, dropped ones included */
    int seen(String name) {
        AtomicInteger n = seen.get(name);
        return n == null ? 0 : n.get();
    }

    private static String stepName(String first, String second) {
        String f = first.toUpperCase(Locale.ROOT);
        if (f.startsWith("IDEM.")) return f.substring(5).toLowerCase(Locale.ROOT);
        if (f.equals("FCALL") && second.startsWith("idem_")) return second.substring(5);
        return f.toLowerCase(Locale.ROOT);
    }

    /** Whether a command's name matches the armed one: IDEM.X, or FCALL idem_x (mdone: a batch's idem_done on the Functions edition). */
    private boolean matches(String first, String second) {
        String want = command;
        if (want == null) return false;
        String f = first.toUpperCase(Locale.ROOT);
        String fn = switch (want) {
            case "mdone" -> "idem_done";
            case "mrelease" -> "idem_release";
            default -> "idem_" + want;
        };
        return f.equals("IDEM." + want.toUpperCase(Locale.ROOT)) || (f.equals("FCALL") && fn.equals(second));
    }

    /** Takes one cut if the armed command matches. */
    private boolean cut(String first, String second) {
        if (!matches(first, second)) return false;
        while (true) {
            int n = left.get();
            if (n == 0) return false;
            if (n < 0 || left.compareAndSet(n, n - 1)) return true;
        }
    }

    private void accept() {
        while (!listener.isClosed()) {
            try {
                Socket client = listener.accept();
                Socket server = new Socket("127.0.0.1", upstream);
                java.util.concurrent.atomic.AtomicBoolean cut = new java.util.concurrent.atomic.AtomicBoolean();
                Thread up = new Thread(() -> commands(client, server, cut), "proxy-up");
                up.setDaemon(true);
                up.start();
                Thread down = new Thread(() -> replies(server, client, cut), "proxy-down");
                down.setDaemon(true);
                down.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private static void closeBoth(Socket a, Socket b) {
        try {
            a.close();
            b.close();
        } catch (IOException e) {
            // closing
        }
    }

    /** The server's replies to the library, none once the connection is being cut (the reply of the cut command never arrives). */
    private void replies(Socket server, Socket client, java.util.concurrent.atomic.AtomicBoolean cut) {
        byte[] buf = new byte[65536];
        try (InputStream in = server.getInputStream(); OutputStream out = client.getOutputStream()) {
            int n;
            while ((n = in.read(buf)) > 0) {
                if (dark || cut.get()) continue;
                out.write(buf, 0, n);
                out.flush();
            }
        } catch (IOException e) {
            // one side closed
        }
        closeBoth(client, server);
    }

    /** The library's bytes, command by command. */
    private void commands(Socket client, Socket server, java.util.concurrent.atomic.AtomicBoolean cut) {
        try (InputStream in = new java.io.BufferedInputStream(client.getInputStream()); OutputStream out = server.getOutputStream()) {
            while (true) {
                ByteArrayOutputStream raw = new ByteArrayOutputStream();
                String[] name = readCommand(in, raw);
                if (name == null) break;
                String step = stepName(name[0], name[1]);
                seen.computeIfAbsent(step, k -> new AtomicInteger()).incrementAndGet();
                if (step.equals(blackhole)) dark = true;
                if (dark) continue;
                if (cut(name[0], name[1])) {
                    cut.set(true);
                    if (forward) {
                        out.write(raw.toByteArray());
                        out.flush();
                    }
                    client.close();
                    // The server's end stays open a moment, so that it runs what it was sent.
                    Thread.sleep(200);
                    server.close();
                    return;
                }
                out.write(raw.toByteArray());
                out.flush();
            }
        } catch (IOException | InterruptedException e) {
            // one side closed
        }
        closeBoth(client, server);
    }

    private static String line(InputStream in, ByteArrayOutputStream raw) throws IOException {
        StringBuilder s = new StringBuilder();
        int c;
        while ((c = in.read()) != -1) {
            raw.write(c);
            if (c == '\r') {
                raw.write(in.read());
                return s.toString();
            }
            s.append((char) c);
        }
        return null;
    }

    /** One command (a RESP array of bulk strings, or an inline command), its raw bytes in {@code raw}: its first two words. */
    private static String[] readCommand(InputStream in, ByteArrayOutputStream raw) throws IOException {
        String head = line(in, raw);
        if (head == null) return null;
        if (!head.startsWith("*")) {
            String[] words = head.trim().split("\\s+");
            return new String[] {words[0], words.length > 1 ? words[1] : ""};
        }
        int n = Integer.parseInt(head.substring(1));
        String[] first = {"", ""};
        for (int i = 0; i < n; i++) {
            String len = line(in, raw);
            if (len == null) return null;
            byte[] arg = in.readNBytes(Integer.parseInt(len.substring(1)));
            raw.write(arg);
            raw.write(in.read());
            raw.write(in.read());
            if (i < 2) first[i] = new String(arg, StandardCharsets.ISO_8859_1);
        }
        return first;
    }

    @Override
    public void close() throws IOException {
        listener.close();
    }
}
