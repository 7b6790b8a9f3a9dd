// A webhook receiver on Node.js's `http` module, for the receiver matrix
// (tests/integration/webhooks/test_receiver_matrix.py).
//
//     node tests/receivers/node_receiver.js --port P --record FILE
//
// It mirrors tests/receivers/answers.py: the answer by request path, and one JSON line per
// request appended to FILE in tests/webhook_receiver.py's record format, written with one
// write(2) on an O_APPEND descriptor once the body has been read and before answering. The
// headers are recorded raw (`req.rawHeaders`: names as sent, duplicates kept; Node itself
// drops a repeated User-Agent from `req.headers`, so only the raw list shows it).
"use strict";

const fs = require("fs");
const http = require("http");

const HOST = "127.0.0.1";
const BODY = Buffer.from('{"ok":true}');
const SLOW_PIECES = 6;
const SLOW_INTERVAL_MS = 100;
const REDIRECT_TARGET = "/redirected";
const ANSWERS = {
  "/hook": { status: 200, kind: "plain" },
  "/chunked": { status: 200, kind: "chunked" },
  "/close": { status: 200, kind: "close" },
  "/slow": { status: 200, kind: "slow" },
  "/gone": { status: 410, kind: "gone" },
  "/redirect": { status: 302, kind: "redirect", location: REDIRECT_TARGET },
  [REDIRECT_TARGET]: { status: 200, kind: "redirected" },
};
const NOT_SERVED = { status: 404, kind: "not-served" };

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    throw new Error(`${name} is required`);
  }
  return process.argv[i + 1];
}

function pieces(body, count) {
  const out = [];
  for (let i = 0; i < count; i++) {
    out.push(body.subarray(Math.floor((body.length * i) / count),
      Math.floor((body.length * (i + 1)) / count)));
  }
  return out;
}

const port = Number(arg("--port"));
const recordFd = fs.openSync(arg("--record"), "a"); // O_WRONLY | O_APPEND | O_CREAT
let count = 0;

function record(req, received, body, answer) {
  const headers = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    headers.push([req.rawHeaders[i], req.rawHeaders[i + 1]]);
  }
  count += 1;
  const entry = {
    n: count,
    at: received,
    method: req.method,
    path: req.url,
    headers,
    body_b64: body.toString("base64"),
    answer,
  };
  // One write of the whole line (a reader sees whole lines only).
  fs.writeSync(recordFd, JSON.stringify(entry) + "\n");
}

function answerRequest(req, res, answer) {
  const ok = answer.status >= 200 && answer.status < 300;
  const payload = ok ? BODY : Buffer.from(`status ${answer.status}`);
  res.statusCode = answer.status;
  res.setHeader("Content-Type", "application/json");
  if (answer.kind === "redirect") {
    res.setHeader("Location", answer.location);
  }
  if (answer.kind === "close") {
    res.setHeader("Connection", "close"); // Node closes the connection after the response
  }
  if (answer.kind === "chunked") {
    // No Content-Length: Node sends Transfer-Encoding: chunked, a chunk per write.
    for (const piece of pieces(payload, 3)) {
      res.write(piece);
    }
    res.end();
    return;
  }
  if (answer.kind === "slow") {
    // The head and the first piece at once, then a piece every 100 ms (chunked).
    const parts = pieces(payload, SLOW_PIECES);
    res.flushHeaders();
    res.write(parts[0]);
    let i = 1;
    const timer = setInterval(() => {
      if (res.destroyed) {
        clearInterval(timer);
        return;
      }
      if (i < parts.length) {
        res.write(parts[i]);
        i += 1;
      }
      if (i >= parts.length) {
        clearInterval(timer);
        res.end();
      }
    }, SLOW_INTERVAL_MS);
    return;
  }
  res.setHeader("Content-Length", payload.length);
  res.end(payload);
}

const server = http.createServer((req, res) => {
  const received = Date.now() / 1000;
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const path = req.url.split("?")[0];
    const answer = Object.prototype.hasOwnProperty.call(ANSWERS, path)
      ? { ...ANSWERS[path] }
      : { ...NOT_SERVED };
    record(req, received, Buffer.concat(chunks), answer);
    answerRequest(req, res, answer);
  });
});

server.listen(port, HOST, () => {
  console.log(`listening on ${HOST}:${port}`);
});

process.on("SIGTERM", () => {
  server.close();
  server.closeAllConnections();
  fs.closeSync(recordFd);
  process.exit(0);
});
