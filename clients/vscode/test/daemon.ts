/**
 * A private ctxd for a test: `ctxd --stdio` with an empty configuration file and a data
 * directory of its own under a temporary directory (never the user's daemon or data).
 * The executable is $CTXD_BIN (tests/clients/test_vscode.py passes the venv's), else
 * the repository's .venv/bin/ctxd.
 */
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { ServerCommand } from "../src/protocol/client";

export function ctxdBinary(): string {
  const fromEnv = process.env.CTXD_BIN;
  if (fromEnv) {
    return fromEnv;
  }
  const repo = path.resolve(__dirname, "..", "..", "..", "..");
  const venv = path.join(repo, ".venv", "bin", "ctxd");
  if (!fs.existsSync(venv)) {
    throw new Error(`no ctxd: set CTXD_BIN or create ${venv} (README: python3 -m venv .venv && .venv/bin/pip install .)`);
  }
  return venv;
}

export interface TestDaemon {
  root: string;
  dataDir: string;
  command: ServerCommand;
  remove(): void;
}

/** The environment of a test daemon: no CTXD_* of the caller. */
export function cleanEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith("CTXD_")) {
      env[k] = v;
    }
  }
  return env;
}

export function testDaemon(extraArgs: string[] = []): TestDaemon {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-vscode-"));
  const config = path.join(root, "config.toml");
  fs.writeFileSync(config, "");
  const dataDir = path.join(root, "data");
  return {
    root,
    dataDir,
    command: {
      command: ctxdBinary(),
      args: ["--stdio", "--config", config, "--data-dir", dataDir, ...extraArgs],
      env: cleanEnv(),
    },
    remove: () => fs.rmSync(root, { recursive: true, force: true }),
  };
}

/** A tool-using agent's turns, `turns` of them: enough text that a small window must compress. */
export function agentTurns(turns: number, from = 0): import("../src/protocol/types").Message[] {
  const out: import("../src/protocol/types").Message[] = [];
  for (let i = from; i < from + turns; i++) {
    const id = `call_${i}`;
    out.push({ role: "user", content: `Step ${i}: look at module ${i} and fix the parser bug number ${i}.` });
    out.push({
      role: "assistant",
      content: `I will read src/module_${i}.py first.`,
      toolCalls: [{ id, type: "function", function: { name: "read_file", arguments: JSON.stringify({ path: `src/module_${i}.py` }) } }],
    });
    const body = Array.from({ length: 40 }, (_, j) => `def function_${i}_${j}(value):\n    return parse(value) + ${j}  # line ${j}`).join("\n");
    out.push({ role: "tool", toolCallId: id, content: body });
    out.push({ role: "assistant", content: `Fixed the off-by-one in function_${i}_3 of src/module_${i}.py.` });
  }
  return out;
}

export interface TestForwarderTarget {
  root: string;
  socket: string;
  /** `ctxd --remote auto` on this test's socket (its daemon is started on first use). */
  command: ServerCommand;
  remove(): void;
}

/**
 * What the extension runs by default, `ctxd --remote auto`, pointed at a socket and a
 * data directory of the test's own (`--set daemon.socket=...`), so the daemon it starts
 * is the test's, never the user's.
 */
export function testForwarder(): TestForwarderTarget {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-vsf-"));
  const config = path.join(root, "config.toml");
  fs.writeFileSync(config, "");
  const socket = path.join(root, "d.sock");
  return {
    root,
    socket,
    command: {
      command: ctxdBinary(),
      args: ["--remote", "auto", "--config", config, "--set", `daemon.socket=${socket}`, "--data-dir", path.join(root, "data")],
      env: cleanEnv(),
    },
    remove: () => fs.rmSync(root, { recursive: true, force: true }),
  };
}
