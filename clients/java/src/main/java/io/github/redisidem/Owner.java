package io.github.redisidem;

import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/** The default OWNER: the host name as gethostname(2) gives it, ':', the process id. */
final class Owner {
    private Owner() {}

    static final String DEFAULT = of(host(), ProcessHandle.current().pid());

    /** host:pid, the host cut so that the whole fits OWNER's 64 bytes. */
    static String of(String host, long pid) {
        String tail = ":" + pid;
        byte[] h = host.getBytes(StandardCharsets.UTF_8);
        int room = 64 - tail.length();
        if (h.length > room) host = new String(h, 0, room, StandardCharsets.UTF_8).replace("\uFFFD", "");
        return host + tail;
    }

    /** gethostname(2): on Linux the UTS name the kernel keeps; elsewhere Java's own call to it. */
    private static String host() {
        try {
            String name = Files.readString(Path.of("/proc/sys/kernel/hostname")).trim();
            if (!name.isEmpty()) return name;
        } catch (Exception | LinkageError ignored) {
            // not Linux
        }
        try {
            return InetAddress.getLocalHost().getHostName();
        } catch (Exception e) {
            // getLocalHost resolves the name and fails when it cannot: its message starts with the name
            String m = String.valueOf(e.getMessage());
            int colon = m.indexOf(':');
            return colon > 0 ? m.substring(0, colon) : "localhost";
        }
    }
}
