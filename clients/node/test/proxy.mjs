// A TCP proxy in front of a server, for the cases that cut a connection
// (clients/conformance/README.md, `cut_reply` and `cut_request`): it
// forwards bytes both ways, reading the client's side as RESP commands.
// Once armed for a command, the next time the client sends it (`times`
// times, or every time: 'all'): `reply`: the command is forwarded, then the
// client's connection is closed before the reply can reach it (the server
// runs it all the same); `request`: the connection is closed without
// forwarding it (the server never sees it). It keeps listening, so the
// client reconnects.
import net from 'node:net';

/** The end of the RESP command at `offset` in `buf`, and its arguments as text; undefined while incomplete. */
function parseCommand(buf, offset) {
  const line = (at) => {
    const end = buf.indexOf('\r\n', at);
    return end < 0 ? undefined : [buf.toString('latin1', at, end), end + 2];
  };
  const head = line(offset);
  if (!head) return undefined;
  if (head[0][0] !== '*') return { end: head[1], args: head[0].split(' ') }; // an inline command
  const count = Number(head[0].slice(1));
  const args = [];
  let at = head[1];
  for (let i = 0; i < count; i++) {
    const size = line(at);
    if (!size) return undefined;
    const len = Number(size[0].slice(1));
    if (buf.length < size[1] + len + 2) return undefined;
    args.push(buf.toString('latin1', size[1], Math.min(size[1] + len, size[1] + 64)));
    at = size[1] + len + 2;
  }
  return { end: at, args };
}

/** The proxy's names of a command: IDEM.DONE is `done`; on the Functions edition FCALL idem_done is `done`, and `mdone` (a batch's first). */
function names(args) {
  const name = (args[0] ?? '').toLowerCase();
  if (name === 'fcall' || name === 'fcall_ro') {
    const fn = (args[1] ?? '').toLowerCase().replace(/^idem_/, '');
    return ['claim', 'done', 'release'].includes(fn) ? [fn, `m${fn}`] : [fn];
  }
  return name.startsWith('idem.') ? [name.slice(5)] : [];
}

export async function startProxy(port) {
  let rule = null; // { kind, command, left }
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    sockets.add(client).add(upstream);
    let pending = Buffer.alloc(0);
    let cut = false;
    const cutHere = (forward) => {
      if (forward.length) upstream.write(forward);
      cut = true;
      client.destroy(); // before any reply is forwarded
      setTimeout(() => upstream.end(), 200); // what was forwarded runs all the same
    };
    client.on('data', (chunk) => {
      if (cut) return;
      pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      let offset = 0;
      for (let command; (command = parseCommand(pending, offset)); offset = command.end) {
        if (rule && names(command.args).includes(rule.command)) {
          const kind = rule.kind;
          if (--rule.left <= 0) rule = null;
          return cutHere(pending.subarray(0, kind === 'reply' ? command.end : offset));
        }
      }
      if (offset) upstream.write(pending.subarray(0, offset));
      pending = pending.subarray(offset);
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
    /** `kind` 'reply' or 'request', the proxy's command name, `times` (a number, or 'all') */
    cut: (kind, command, times = 1) => {
      rule = { kind, command, left: times === 'all' ? Infinity : times };
    },
    /** the next DONE's reply is lost (`{ always: true }`: every DONE's) */
    arm: (o = {}) => {
      rule = { kind: 'reply', command: 'done', left: o.always ? Infinity : 1 };
    },
    stop: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
