// Starts the fauxqs SQS emulator bound to one address only (127.0.0.1 by
// default). fauxqs's own CLI listens on 0.0.0.0; this launcher uses its
// buildApp and chooses the address itself.
//
//   FAUXQS_PORT  port to listen on (default 4566; 0 picks a free one)
//   FAUXQS_BIND  address to bind (default 127.0.0.1)
//
// Prints "fauxqs listening on http://ADDR:PORT" once it accepts requests.
import { buildApp } from "fauxqs";

const port = Number.parseInt(process.env.FAUXQS_PORT ?? "4566", 10);
const host = process.env.FAUXQS_BIND ?? "127.0.0.1";
const app = buildApp({ logger: process.env.FAUXQS_LOGGER === "true" });

const address = await app.listen({ port, host });
console.log(`fauxqs listening on ${address}`);

for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    app.close().then(() => process.exit(0));
  });
}
