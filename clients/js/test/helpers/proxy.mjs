// A TCP proxy on a loopback port in front of a server, that a test can cut
// (refusing and breaking connections, as an unreachable server would) and
// restore.
import net from "node:net";

export async function startProxy(targetPort) {
  const conns = new Set();
  let server;
  let port = 0;
  const listen = () =>
    new Promise((res, rej) => {
      server = net.createServer((c) => {
        const up = net.connect(targetPort, "127.0.0.1");
        conns.add(c);
        conns.add(up);
        const drop = () => {
          c.destroy();
          up.destroy();
          conns.delete(c);
          conns.delete(up);
        };
        c.on("error", drop).on("close", drop);
        up.on("error", drop).on("close", drop);
        c.pipe(up);
        up.pipe(c);
      });
      server.on("error", rej);
      server.listen(port, "127.0.0.1", () => {
        port = server.address().port;
        res();
      });
    });
  await listen();
  return {
    get port() {
      return port;
    },
    get url() {
      return `http://127.0.0.1:${port}`;
    },
    /** Closes the listener and breaks every connection. */
    async cut() {
      await new Promise((r) => {
        server.close(() => r());
        for (const c of conns) c.destroy();
        conns.clear();
      });
    },
    /** Listens again on the same port. */
    async restore() {
      await listen();
    },
    async close() {
      for (const c of conns) c.destroy();
      await new Promise((r) => (server.listening ? server.close(() => r()) : r()));
    },
  };
}
