/**
 * The extension's default transport: `ctxd --remote auto`, the stdio forwarder to the
 * shared daemon, which it starts when none runs (on the test's own socket and data).
 */
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import { createApi } from "../src/api";
import { CtxdClient } from "../src/protocol/client";
import { ConnectionState, CtxdSupervisor } from "../src/protocol/supervisor";
import { CtxdNotification } from "../src/protocol/types";
import { TestForwarderTarget, testForwarder } from "./daemon";

function nextState(supervisor: CtxdSupervisor, kind: ConnectionState["kind"]): Promise<ConnectionState> {
  return new Promise((resolve) => {
    const sub = supervisor.onState((s) => {
      if (s.kind === kind) {
        sub.dispose();
        resolve(s);
      }
    });
  });
}

describe("through ctxd --remote auto", () => {
  let target: TestForwarderTarget;
  const supervisors: CtxdSupervisor[] = [];

  before(() => {
    target = testForwarder();
  });

  after(async () => {
    // Stop the daemon the forwarder started (daemon/stop), then the forwarders.
    const client = supervisors.find((s) => s.client)?.client;
    if (client) {
      await client.request("daemon/stop").catch(() => undefined);
    }
    for (const s of supervisors) {
      await s.stop();
    }
    target.remove();
  });

  it("starts the shared daemon, and two editors see each other's sessions live", async () => {
    assert.equal(fs.existsSync(target.socket), false);
    const a = new CtxdSupervisor({ resolveCommand: () => target.command, firstRetryMs: 50 });
    const b = new CtxdSupervisor({ resolveCommand: () => target.command, firstRetryMs: 50 });
    supervisors.push(a, b);
    a.start();
    const clientA = await a.ready();
    b.start();
    const clientB = await b.ready();
    assert.ok(fs.existsSync(target.socket));
    const status = await clientA.daemonStatus();
    assert.ok(status.transports.some((t) => t.includes(target.socket)), JSON.stringify(status.transports));
    assert.ok(status.connections >= 2);

    const apiA = createApi(a);
    const apiB = createApi(b);
    const session = await apiA.createSession({ title: "shared" });
    const seen = new Promise<CtxdNotification>((resolve) => {
      const sub = apiB.subscribe(session.sessionId, (n) => {
        if (n.method === "session/updated") {
          sub.dispose();
          resolve(n);
        }
      });
    });
    await apiA.push(session.sessionId, [{ role: "user", content: "pushed by editor A" }]);
    const note = await seen;
    assert.equal(note.params.sessionId, session.sessionId);
    const prompt = await apiB.prompt(session.sessionId);
    assert.deepEqual(prompt.messages.map((m) => m.content), ["pushed by editor A"]);
    assert.notEqual(clientA.pid, clientB.pid);
  });

  it("reconnects through a new forwarder when one dies; the daemon and its sessions stay", async () => {
    const a = supervisors[0];
    const before = await a.ready();
    const { sessions } = await before.listSessions();
    const reconnected = nextState(a, "connected");
    before.child.kill("SIGKILL");
    const state = await reconnected;
    assert.ok(state.kind === "connected");
    const after = await a.ready();
    assert.notEqual(after, before);
    const again = await after.listSessions();
    assert.deepEqual(again.sessions.map((s) => s.sessionId), sessions.map((s) => s.sessionId));
    assert.equal((await after.daemonStatus()).pid, (await supervisors[1].client?.daemonStatus())?.pid);
  });

  it("the forwarder relays $/progress of a requested compression", async () => {
    const client: CtxdClient = await supervisors[1].ready();
    const session = await client.createSession({ title: "progress" });
    await client.push(session.sessionId, Array.from({ length: 30 }, (_, i) => ({
      role: i % 2 ? "assistant" as const : "user" as const,
      content: `Turn ${i}: ${"details of the parser work ".repeat(20)}`,
    })));
    const kinds: string[] = [];
    const result = await client.compress(session.sessionId, { onProgress: (p) => kinds.push(p.kind) });
    assert.equal(result.compressed, true, JSON.stringify(result));
    assert.equal(kinds[0], "begin");
    assert.equal(kinds[kinds.length - 1], "end");
  });
});
