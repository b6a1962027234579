/** Reconnection, the "not installed" error and the exports API, against a real ctxd. */
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { createApi } from "../src/api";
import { CtxdClient, CtxdStartError } from "../src/protocol/client";
import { INSTALL_FIX, locateCtxd } from "../src/protocol/locate";
import { ConnectionState, CtxdSupervisor } from "../src/protocol/supervisor";
import { CtxdNotification } from "../src/protocol/types";
import { TestDaemon, testDaemon } from "./daemon";

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

describe("CtxdSupervisor", () => {
  let daemon: TestDaemon;
  let supervisor: CtxdSupervisor;

  before(() => {
    daemon = testDaemon();
    supervisor = new CtxdSupervisor({ resolveCommand: () => daemon.command, firstRetryMs: 20, maxRetryMs: 200 });
  });

  after(async () => {
    await supervisor.stop();
    daemon.remove();
  });

  it("connects, and reconnects after ctxd is killed, with the data still there", async () => {
    const connected = nextState(supervisor, "connected");
    supervisor.start();
    await connected;
    const first = await supervisor.ready();
    const api = createApi(supervisor);
    const session = await api.createSession({ title: "survives" });
    await api.push(session.sessionId, [{ role: "user", content: "remember the walrus" }]);

    const disconnected = nextState(supervisor, "disconnected");
    const reconnected = nextState(supervisor, "connected");
    first.child.kill("SIGKILL");
    const down = await disconnected;
    assert.equal(down.kind, "disconnected");
    if (down.kind === "disconnected") {
      assert.match(down.reason, /SIGKILL/);
    }
    const up = await reconnected;
    assert.ok(up.kind === "connected" && up.client !== first);

    // The new connection is subscribed again: notifications flow through the API.
    const seen: CtxdNotification[] = [];
    const updated = new Promise<void>((resolve) => {
      const sub = api.subscribe(session.sessionId, (n) => {
        seen.push(n);
        if (n.method === "session/updated") {
          sub.dispose();
          resolve();
        }
      });
    });
    const pushed = await api.push(session.sessionId, [{ role: "assistant", content: "noted" }]);
    assert.equal(pushed.messageCount, 2);
    await updated;
    assert.ok(seen.every((n) => n.params.sessionId === session.sessionId));
    const prompt = await api.prompt(session.sessionId, "ollama");
    assert.equal(prompt.format, "ollama");
    assert.deepEqual(prompt.messages.map((m) => m.content), ["remember the walrus", "noted"]);
    const stats = await api.stats(session.sessionId);
    assert.equal(stats.messageCount, 2);
    const listed = await api.request<{ sessions: { sessionId: string }[] }>("session/list");
    assert.ok(listed.sessions.some((s) => s.sessionId === session.sessionId));
  });

  it("fails with the fix when ctxd is not installed, and does not retry", async () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), "ctxd-vscode-empty-"));
    try {
      const missing = new CtxdSupervisor({
        resolveCommand: () => {
          const located = locateCtxd({ envPath: empty });
          return located.ok ? { command: located.command, args: [] } : new CtxdStartError("notFound", located.problem, located.fix);
        },
      });
      const failed = nextState(missing, "failed");
      missing.start();
      const state = await failed;
      assert.equal(state.kind, "failed");
      if (state.kind === "failed") {
        assert.equal(state.error.kind, "notFound");
        assert.match(state.error.message, /not installed/);
        assert.ok(state.error.fix.includes(INSTALL_FIX));
      }
      await assert.rejects(missing.ready(), /not installed/);
      assert.equal(missing.state.kind, "failed");
    } finally {
      fs.rmSync(empty, { recursive: true, force: true });
    }
  });

  it("says so when the executable cannot be run", async () => {
    await assert.rejects(CtxdClient.start({ command: path.join(os.tmpdir(), "no-such-ctxd-here"), args: [] }),
      (err: unknown) => err instanceof CtxdStartError && err.kind === "notFound" && err.fix === INSTALL_FIX);
  });

  it("names the fix when ctxd refuses the arguments, quoting its error", async () => {
    const d = testDaemon(["--no-such-flag"]);
    try {
      await assert.rejects(CtxdClient.start(d.command),
        (err: unknown) => err instanceof CtxdStartError && err.kind === "exited" && /--no-such-flag/.test(err.problem));
    } finally {
      d.remove();
    }
  });
});
