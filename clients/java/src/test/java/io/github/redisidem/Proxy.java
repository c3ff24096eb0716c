package io.github.redisidem;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A TCP proxy for cut_reply: bytes both ways; once armed, after forwarding
 * a client chunk that carries DONE (IDEM.DONE or idem_done) it closes that
 * client's connection before the server's reply can reach it, and goes on
 * listening so the library can reconnect.
 */
final class Proxy implements AutoCloseable {
    private final ServerSocket listener;
    private final int upstream;
    private final AtomicBoolean armed = new AtomicBoolean();
    volatile int cuts;

    Proxy(int upstream) throws IOException {
        this.upstream = upstream;
        this.listener = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
        Thread t = new Thread(this::accept, "proxy");
        t.setDaemon(true);
        t.start();
    }

    int port() {
        return listener.getLocalPort();
    }

    void arm() {
        armed.set(true);
    }

    private void accept() {
        while (!listener.isClosed()) {
            try {
                Socket client = listener.accept();
                Socket server = new Socket("127.0.0.1", upstream);
                AtomicBoolean cut = new AtomicBoolean();
                pump(server.getInputStream(), client.getOutputStream(), cut, null, client, server);
                pump(client.getInputStream(), server.getOutputStream(), cut, client, client, server);
            } catch (IOException e) {
                return;
            }
        }
    }

    private void pump(InputStream in, OutputStream out, AtomicBoolean cut, Socket watched, Socket client, Socket server) {
        Thread t = new Thread(() -> {
            byte[] buf = new byte[65536];
            try {
                int n;
                while ((n = in.read(buf)) > 0) {
                    boolean fromClient = watched != null;
                    if (!fromClient && cut.get()) continue;
                    if (fromClient && armed.get()) {
                        String chunk = new String(buf, 0, n, StandardCharsets.ISO_8859_1);
                        if ((chunk.contains("IDEM.DONE") || chunk.contains("idem_done")) && armed.compareAndSet(true, false)) {
                            cut.set(true);
                            out.write(buf, 0, n);
                            out.flush();
                            client.close();
                            cuts++;
                            // The server's end stays open a moment, so that it runs the DONE it was sent.
                            Thread.sleep(200);
                            server.close();
                            return;
                        }
                    }
                    out.write(buf, 0, n);
                    out.flush();
                }
            } catch (IOException | InterruptedException e) {
                // one side closed
            }
            try {
                client.close();
                server.close();
            } catch (IOException e) {
                // closing
            }
        }, "proxy-pump");
        t.setDaemon(true);
        t.start();
    }

    @Override
    public void close() throws IOException {
        listener.close();
    }
}
