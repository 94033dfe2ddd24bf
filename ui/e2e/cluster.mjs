// @ts-check
/**
 * A real cluster of `shoal node` processes on loopback for the browser test: each node with its own
 * data directory and ports, joined with codes from the first node, every process in its own process
 * group so that cleanup also ends its workers. The binary is copied first, so a `cargo build` running
 * at the same time cannot replace it under the nodes (their workers start from the same file). The
 * nodes see an empty Hugging Face cache of their own and a hub address where nothing listens, so their
 * libraries hold only what the test adds and a download never leaves the machine.
 */
import { execFileSync, spawn } from 'node:child_process';
import { copyFileSync, chmodSync, linkSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer } from 'node:net';
import path from 'node:path';

/** @typedef {{ name: string, port: number, dataDir: string, pid: number, log: string, exited: boolean }} RunningNode */

const sleep = (/** @type {number} */ ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Polls `probe` until it returns a value other than undefined, or fails after `timeoutMs` with `what`.
 * @template T
 * @param {string} what
 * @param {() => Promise<T | undefined>} probe
 * @param {number} timeoutMs
 * @returns {Promise<T>}
 */
export async function waitFor(what, probe, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let lastError = null;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${lastError ? ` (last error: ${lastError})` : ''}`);
    }
    await sleep(200);
  }
}

/**
 * @param {number} port
 * @param {string} route
 * @param {{ method?: string, body?: unknown }} [options]
 * @returns {Promise<any>}
 */
export async function api(port, route, options = {}) {
  const response = await fetch(`http://127.0.0.1:${port}${route}`, {
    method: options.method ?? 'GET',
    headers: options.body === undefined ? { 'X-Shoal-Client': 'e2e' } : { 'Content-Type': 'application/json' },
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${options.method ?? 'GET'} ${route} on :${port}: ${response.status} ${text}`);
  return JSON.parse(text);
}

/**
 * Whether `port` can be listened on at 127.0.0.1 right now.
 * @param {number} port
 * @returns {Promise<boolean>}
 */
function canListen(port) {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/**
 * The first base port from `from` (then in steps of 100) such that it and the `count - 1` ports after
 * it are free now. Keep `from` below 32768, Linux's first ephemeral port: an outgoing connection of
 * anything on the machine can hold a port above it at any moment.
 * @param {number} from
 * @param {number} count
 */
export async function freePortRange(from, count) {
  for (let base = from; base + count < 32768; base += 100) {
    let free = true;
    for (let port = base; free && port < base + count; port++) free = await canListen(port);
    if (free) return base;
  }
  throw new Error(`no ${count} free ports in a row from ${from} below 32768`);
}

export class Cluster {
  /**
   * @param {{ binary: string, basePort: number, memoryLimit: string }} options
   */
  constructor(options) {
    this.root = mkdtempSync(path.join(tmpdir(), 'shoal-ui-e2e-'));
    this.binary = path.join(this.root, 'shoal');
    copyFileSync(options.binary, this.binary);
    chmodSync(this.binary, 0o755);
    this.basePort = options.basePort;
    this.memoryLimit = options.memoryLimit;
    /** @type {RunningNode[]} */
    this.nodes = [];
    /** @type {NodeJS.ProcessEnv} */
    this.env = { ...process.env, HF_HOME: path.join(this.root, 'hf'), HF_ENDPOINT: 'http://127.0.0.1:9' };
    delete this.env['HF_HUB_CACHE'];
    delete this.env['HF_TOKEN'];
  }

  /**
   * Adds a GGUF file to the library of node `name` (started or not) with `shoal models add`.
   * @param {string} name
   * @param {string} file
   */
  addModel(name, file) {
    execFileSync(this.binary, ['models', 'add', file, '--data-dir', path.join(this.root, name)], { env: this.env, stdio: 'pipe' });
  }

  /**
   * Puts a GGUF file into node `name`'s models folder, `<data-dir>/models/<folder>/` (ORG--NAME, as
   * `shoal pull` names it), where the node finds it as a download and offers it to its peers. A hard
   * link, or a copy where the file is on another file system. Returns the file's path there.
   * @param {string} name
   * @param {string} file
   * @param {string} folder
   */
  placeModel(name, file, folder) {
    const dir = path.join(this.root, name, 'models', folder);
    mkdirSync(dir, { recursive: true });
    const dest = path.join(dir, path.basename(file));
    try {
      linkSync(file, dest);
    } catch {
      copyFileSync(file, dest);
    }
    return dest;
  }

  /**
   * Starts node `name` on the next free pair of ports, joining through `join` (CODE@HOST:PORT) if given.
   * @param {string} name
   * @param {string | null} join
   * @param {string[]} [extra] more arguments of `shoal node`
   */
  start(name, join, extra = []) {
    const port = this.basePort + 2 * this.nodes.length;
    const dataDir = path.join(this.root, name);
    const log = path.join(this.root, `${name}.log`);
    const args = ['node', '--data-dir', dataDir, '--port', String(port), '--name', name, '--no-mdns'];
    args.push('--memory-limit', this.memoryLimit);
    if (join !== null) args.push('--join', join);
    args.push(...extra);
    const out = openSync(log, 'w');
    const child = spawn(this.binary, args, { detached: true, stdio: ['ignore', out, out], env: this.env });
    if (child.pid === undefined) throw new Error(`could not start ${this.binary}`);
    /** @type {RunningNode} */
    const node = { name, port, dataDir, pid: child.pid, log, exited: false };
    child.on('exit', () => (node.exited = true));
    this.nodes.push(node);
    return node;
  }

  /**
   * @param {RunningNode} node
   */
  async healthy(node) {
    return waitFor(`${node.name} to answer on :${node.port}`, async () => {
      if (node.exited) throw new Error(`${node.name} exited: ${this.logOf(node)}`);
      return (await api(node.port, '/api/health')).ok === true ? true : undefined;
    }, 15_000);
  }

  /**
   * Starts `names` one after another, each joining through the first with a fresh code, and waits
   * until the first node sees every member alive and a measured link between every pair.
   * @param {string[]} names
   */
  async form(names) {
    const [firstName, ...rest] = names;
    if (firstName === undefined) throw new Error('no nodes to start');
    const first = this.start(firstName, null);
    await this.healthy(first);
    for (const name of rest) {
      const { code } = await api(first.port, '/api/cluster/code', { method: 'POST' });
      const node = this.start(name, `${code}@127.0.0.1:${first.port + 1}`);
      await this.healthy(node);
    }
    await waitFor('every member alive with telemetry, and every link measured', async () => {
      const snapshot = await api(first.port, '/api/cluster');
      const up = snapshot.nodes.filter((/** @type {any} */ n) => (n.status === 'self' || n.status === 'alive') && n.telemetry);
      const pairs = (names.length * (names.length - 1)) / 2;
      const measured = snapshot.links.filter((/** @type {any} */ l) => l.rtt_p50_us !== null);
      return up.length === names.length && measured.length === pairs ? snapshot : undefined;
    }, 30_000);
    return this.nodes;
  }

  /**
   * SIGKILLs the node's agent only (its workers see their stdin close and end).
   * @param {RunningNode} node
   */
  kill(node) {
    try {
      process.kill(node.pid, 'SIGKILL');
    } catch {
      // Already gone.
    }
  }

  /**
   * @param {RunningNode} node
   */
  logOf(node) {
    return existsSync(node.log) ? readFileSync(node.log, 'utf8').slice(-2000) : '(no log)';
  }

  /** Ends every process this cluster started (and their workers) and removes its files. */
  async stop() {
    for (const node of this.nodes) {
      for (const target of [-node.pid, node.pid]) {
        try {
          process.kill(target, 'SIGKILL');
        } catch {
          // Gone already.
        }
      }
    }
    await waitFor('every node process to exit', async () => (this.nodes.every((n) => n.exited) ? true : undefined), 10_000).catch(
      () => undefined,
    );
    rmSync(this.root, { recursive: true, force: true });
  }
}
