// BullMQ's side of the benchmark (Node.js); benchmarks/peers/bullmq.py drives it.
//
//   node bullmq.mjs producer   JSON commands on stdin, one JSON reply a line on
//                              stdout: the enqueue workloads, timed here, in
//                              Node, so that no pipe round trip is in them
//   node bullmq.mjs worker CONFIG
//                              one BullMQ Worker with a no-op processor, the
//                              counterpart of benchmarks/peers/_harness.py's
//                              worker process (same CONFIG, same shared slots
//                              file, same result JSON)
//
// Clocks: process.hrtime is CLOCK_MONOTONIC on Linux, the clock of Python's
// time.monotonic, so a worker here compares its handler's start with a send
// time taken in another process. CPU: process.cpuUsage (user + system).
//
// The packages come from the folder that CONFIG/the command's "node_dir" names
// (benchmarks/.venvs/bullmq, installed by benchmarks/_node.py), never from here.

import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";

const mono = () => Number(process.hrtime.bigint()) / 1e9;
const cpuSeconds = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const WATCH_INTERVAL_MS = 5;

function loadBullmq(nodeDir) {
  const require = createRequire(path.join(nodeDir, "package.json"));
  return require("bullmq");
}

function connection(url) {
  const u = new URL(url);
  const options = { host: u.hostname || "127.0.0.1", port: Number(u.port || 6379) };
  if (u.password) options.password = decodeURIComponent(u.password);
  if (u.username) options.username = decodeURIComponent(u.username);
  const db = u.pathname.replace("/", "");
  if (db) options.db = Number(db);
  // What BullMQ asks of a worker's connection (its blocking calls must not be
  // retried by ioredis); the same on the producer for one setting everywhere.
  options.maxRetriesPerRequest = null;
  return options;
}

// -- the producer -----------------------------------------------------------------

async function producer() {
  let queue = null;
  const ops = {
    async open({ url, queue: name, node_dir: nodeDir }) {
      const { Queue } = loadBullmq(nodeDir);
      queue = new Queue(name, { connection: connection(url) });
      await queue.waitUntilReady();
      return { node: process.version };
    },
    async close() {
      if (queue !== null) await queue.close();
      queue = null;
      return {};
    },
    async enqueue({ x, delay }) {
      await queue.add("noop", { x }, delay ? { delay: delay * 1000 } : undefined);
      return {};
    },
    async sequential({ n }) {
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await queue.add("noop", { x: 0 });
      return { per_s: n / ((performance.now() - t0) / 1000) };
    },
    async concurrent({ n, lanes }) {
      let next = 0;
      const lane = async () => {
        while (next < n) {
          next++;
          await queue.add("noop", { x: 0 });
        }
      };
      const t0 = performance.now();
      await Promise.all(Array.from({ length: lanes }, lane));
      return { per_s: n / ((performance.now() - t0) / 1000) };
    },
    async batch({ n, size, in_flight: inFlight, x }) {
      let next = 0;
      const lane = async () => {
        while (next < n) {
          const start = next;
          const stop = Math.min(start + size, n);
          next = stop;
          const jobs = [];
          for (let i = start; i < stop; i++) jobs.push({ name: "noop", data: { x } });
          await queue.addBulk(jobs);
        }
      };
      const t0 = performance.now();
      await Promise.all(Array.from({ length: inFlight }, lane));
      return { per_s: n / ((performance.now() - t0) / 1000) };
    },
    // One task every `interval` seconds; x is the send time (or, with a delay,
    // the due time), taken just before the add call, as the Python peers do.
    async paced({ count, interval, delay }) {
      const t0 = mono();
      for (let i = 0; i < count; i++) {
        if (delay) {
          await queue.add("noop", { x: mono() + delay }, { delay: delay * 1000 });
        } else {
          await queue.add("noop", { x: mono() });
        }
        const pause = t0 + (i + 1) * interval - mono();
        if (pause > 0) await sleep(pause * 1000);
      }
      return {};
    },
  };
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const command = JSON.parse(line);
    let reply;
    try {
      reply = { ok: true, ...(await ops[command.op](command)) };
    } catch (err) {
      reply = { ok: false, error: String(err && err.stack ? err.stack : err) };
    }
    reply.cpu_s = cpuSeconds();
    process.stdout.write(JSON.stringify(reply) + "\n");
    if (command.op === "close") break;
  }
}

// -- the worker -------------------------------------------------------------------

class Slots {
  // The harness's shared file: stop flag at 0, per worker (ready, count) at
  // 64 + 16 * index, native-endian int64 (Python's struct "q"). pread/pwrite
  // see the same page cache as the driver's mmap.
  constructor(file) {
    this.fd = fs.openSync(file, "r+");
    this.buf = Buffer.alloc(8);
    this.le = os.endianness() === "LE";
  }
  read(offset) {
    fs.readSync(this.fd, this.buf, 0, 8, offset);
    return Number(this.le ? this.buf.readBigInt64LE(0) : this.buf.readBigInt64BE(0));
  }
  write(offset, value) {
    if (this.le) this.buf.writeBigInt64LE(BigInt(value), 0);
    else this.buf.writeBigInt64BE(BigInt(value), 0);
    fs.writeSync(this.fd, this.buf, 0, 8, offset);
  }
  close() {
    fs.closeSync(this.fd);
  }
}

async function worker(config) {
  const { Worker } = loadBullmq(config.options.node_dir);
  // From here on, as the Python workers: after imports, before connecting.
  const tStart = mono();
  const cpuStart = cpuSeconds();
  const slots = new Slots(config.slots);
  const base = 64 + 16 * config.index;
  const times = [];
  const latencies = [];
  let unmeasured = 0;
  const done = (x) => {
    if (x < 0) {
      unmeasured++;
      return;
    }
    const now = mono();
    times.push(now);
    if (x > 0) latencies.push(now - x);
  };
  slots.write(base, 1);
  const w = new Worker(config.queue, async (job) => done(job.data.x), {
    connection: connection(config.url),
    concurrency: config.concurrency,
  });
  w.on("error", (err) => console.error("worker error:", err));
  let seen = -1;
  let cpuLast = cpuStart;
  while (slots.read(0) !== 1) {
    if (times.length !== seen) {
      seen = times.length;
      cpuLast = cpuSeconds();
      slots.write(base + 8, seen);
    }
    await sleep(WATCH_INTERVAL_MS);
  }
  const result = { t_start: tStart, cpu_s: cpuLast - cpuStart, times, latencies, unmeasured };
  fs.writeFileSync(config.result, JSON.stringify(result));
  slots.close();
  await w.close();
}

const [mode, arg] = process.argv.slice(2);
if (mode === "producer") {
  await producer();
} else if (mode === "worker") {
  await worker(JSON.parse(arg));
} else {
  console.error("usage: node bullmq.mjs producer | worker CONFIG");
  process.exit(2);
}
process.exit(0);
