"""A TCP proxy in front of one Redis server that makes a replication link
behave like a network: it holds each chunk of a replication connection for
a link delay, and a crash loses what it holds.

On one machine a SIGKILLed primary loses nothing: the kernel still delivers
to the replica whatever the primary had written to its socket. A real crash
loses the bytes in flight. Each server announces its proxy's port
(`replica-announce-port`), so replicas and Sentinels reach it through the
proxy. The proxy tells connections apart by their first commands:

- a replica's link (it sends `REPLCONF`): every chunk, both ways, is held
  for `delay` seconds;
- a Sentinel's (`CLIENT SETNAME sentinel-...`): passed at once;
- a client's: passed at once.

`crash()` drops every held chunk and closes every connection (the server is
then killed); `cut(kinds)` closes the connections of those kinds and
refuses new ones (a partition) until `heal()`.
"""

import collections
import socket
import threading
import time


class Link:
    """One proxied connection: two pumps, one per direction."""

    def __init__(self, proxy, downstream):
        self.proxy = proxy
        self.down = downstream
        self.up = socket.create_connection(("127.0.0.1", proxy.target), timeout=5)
        self.up.settimeout(None)
        self.kind = "unknown"
        self.lock = threading.Condition()
        self.held = {"up": collections.deque(), "down": collections.deque()}
        self.closed = False
        for name, src, dst in (("up", self.down, self.up), ("down", self.up, self.down)):
            threading.Thread(target=self.read, args=(name, src), daemon=True).start()
            threading.Thread(target=self.write, args=(name, dst), daemon=True).start()

    def classify(self, data):
        if self.kind != "unknown":
            return
        text = data.upper()
        if b"REPLCONF" in text or b"PSYNC" in text:
            self.kind = "replica"
        elif b"SENTINEL-" in text:
            self.kind = "sentinel"
        elif not text.startswith((b"*1\r\n$4\r\nPING", b"PING", b"*2\r\n$4\r\nAUTH")):
            self.kind = "client"
        if self.kind in self.proxy.refused:
            self.close()

    def read(self, name, src):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if name == "up":
                    self.classify(data)
                delay = self.proxy.delay if self.kind == "replica" else 0.0
                with self.lock:
                    if self.closed:
                        return
                    self.held[name].append((time.monotonic() + delay, data))
                    self.lock.notify_all()
        except OSError:
            pass
        self.close()

    def write(self, name, dst):
        try:
            while True:
                with self.lock:
                    while not self.closed and not self.held[name]:
                        self.lock.wait()
                    if self.closed:
                        return
                    due, data = self.held[name][0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        self.lock.wait(wait)
                        continue
                    self.held[name].popleft()
                dst.sendall(data)
        except OSError:
            self.close()

    def close(self):
        """Drops whatever is held and closes both sides."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for q in self.held.values():
                q.clear()
            self.lock.notify_all()
        for s in (self.down, self.up):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class DelayProxy:
    def __init__(self, target, delay):
        self.target = target
        self.delay = delay
        self.refused = set()
        self.links = []
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                link = Link(self, conn)
            except OSError:
                conn.close()  # the server is down: as a refused connection
                continue
            with self.lock:
                self.links = [l for l in self.links if not l.closed] + [link]

    def crash(self):
        """What a machine's crash does to the links of its server: every
        byte in flight lost, every connection gone."""
        with self.lock:
            links, self.links = self.links, []
        for link in links:
            link.close()

    def cut(self, kinds):
        """A partition: the connections of those kinds closed, new ones refused."""
        self.refused = set(kinds)
        with self.lock:
            links = [l for l in self.links if l.kind in self.refused]
        for link in links:
            link.close()

    def heal(self):
        self.refused = set()
