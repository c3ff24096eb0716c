// A TCP proxy in front of a server, for the conformance cases that cut a
// connection (`cut_reply`): it forwards bytes both ways; once armed, after
// forwarding a client chunk that holds the DONE command (IDEM.DONE, or
// FCALL idem_done) it closes that client's connection before the server's
// reply can reach it. It keeps listening, so the library reconnects.
import net from 'node:net';

const DONE = /idem\.done|idem_done/i;

export async function startProxy(port) {
  let armed = false;
  let always = false;
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    sockets.add(client).add(upstream);
    let cut = false;
    client.on('data', (chunk) => {
      upstream.write(chunk);
      if (armed && DONE.test(chunk.toString('latin1'))) {
        armed = always;
        cut = true;
        client.destroy(); // before any reply is forwarded
        setTimeout(() => upstream.end(), 200); // the server runs the command all the same
      }
    });
    upstream.on('data', (chunk) => !cut && client.write(chunk));
    const close = () => {
      client.destroy();
      if (!cut) upstream.destroy();
    };
    client.on('error', () => undefined).on('close', () => !cut && close());
    upstream.on('error', () => undefined).on('close', close);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: server.address().port,
    /** the next DONE's reply is lost (`{ always: true }`: every DONE's) */
    arm: (o = {}) => {
      armed = true;
      always = !!o.always;
    },
    stop: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
