/** The protocol client against a real ctxd (a private `ctxd --stdio` per test file). */
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import { CtxdClient, CtxdRequestError } from "../src/protocol/client";
import { CtxdNotification, ErrorCodes, WorkDoneProgress } from "../src/protocol/types";
import { TestDaemon, agentTurns, testDaemon } from "./daemon";

/** Resolves with the first notification `accept` returns true for. */
function waitFor(client: CtxdClient, accept: (n: CtxdNotification) => boolean): Promise<CtxdNotification> {
  return new Promise((resolve) => {
    const sub = client.onNotification((n) => {
      if (accept(n)) {
        sub.dispose();
        resolve(n);
      }
    });
  });
}

describe("CtxdClient against ctxd --stdio", () => {
  let daemon: TestDaemon;
  let client: CtxdClient;

  before(async () => {
    daemon = testDaemon();
    client = await CtxdClient.start(daemon.command, { clientName: "ctxd-vscode-test" });
    await client.subscribe("*");
  });

  after(async () => {
    await client.close();
    daemon.remove();
  });

  it("initializes and advertises the methods the extension calls", () => {
    const result = client.initializeResult;
    assert.ok(result);
    assert.equal(result.serverInfo.name, "ctxd");
    for (const method of ["session/push", "context/prompt", "context/stats", "session/search", "context/compress",
      "checkpoint/expand", "snapshot/restore", "goal/update", "message/pin", "session/export"]) {
      assert.ok(result.capabilities.methods.includes(method), method);
    }
  });

  it("creates, pushes, and reads the prompt and stats back", async () => {
    const session = await client.createSession({ title: "create-push", model: "gpt-4o" });
    const updated = waitFor(client, (n) => n.method === "session/updated" && n.params.sessionId === session.sessionId);
    const pushed = await client.push(session.sessionId, [
      { role: "user", content: "Rename the parser module to lexer." },
      { role: "assistant", content: "Renamed src/parser.py to src/lexer.py." },
    ]);
    assert.deepEqual(pushed.messages.map((m) => m.seq), [1, 2]);
    assert.equal(pushed.messageCount, 2);
    const note = await updated;
    assert.equal(note.method, "session/updated");
    if (note.method === "session/updated") {
      assert.equal(note.params.reason, "push");
      assert.equal(note.params.lastSeq, 2);
    }

    const openai = await client.prompt(session.sessionId, "openai");
    assert.equal(openai.format, "openai");
    assert.deepEqual(openai.messages.map((m) => m.role), ["user", "assistant"]);
    const anthropic = await client.prompt(session.sessionId, "anthropic");
    assert.equal(anthropic.format, "anthropic");
    assert.equal(anthropic.messages.length, 2);

    const stats = await client.stats(session.sessionId);
    assert.equal(stats.messageCount, 2);
    assert.equal(stats.budget.promptTokens, openai.budget.promptTokens);
    assert.ok(stats.budget.maxPromptTokens > stats.budget.promptTokens);
  });

  it("searches across sessions", async () => {
    const a = await client.createSession({ title: "search-a" });
    const b = await client.createSession({ title: "search-b" });
    await client.push(a.sessionId, [{ role: "user", content: "The flamingo deploy failed on staging." }]);
    await client.push(b.sessionId, [{ role: "assistant", content: "Rolled back the flamingo release." }]);
    const result = await client.search({ query: "flamingo" });
    const sessions = new Set(result.hits.map((h) => h.sessionId));
    assert.ok(sessions.has(a.sessionId) && sessions.has(b.sessionId), JSON.stringify(result.hits));
    const history = await client.history(b.sessionId, 1, 5);
    assert.equal(history.messages[0].seq, 1);
  });

  it("compresses on request with $/progress and notifications, and expands the checkpoint", async () => {
    const session = await client.createSession({ title: "compress", contextWindow: 200000 });
    await client.push(session.sessionId, agentTurns(12));
    const compressed = waitFor(client, (n) => n.method === "context/compressed" && n.params.sessionId === session.sessionId);
    const created = waitFor(client, (n) => n.method === "checkpoint/created" && n.params.sessionId === session.sessionId);
    const progress: WorkDoneProgress[] = [];
    const result = await client.compress(session.sessionId, { onProgress: (p) => progress.push(p) });
    assert.equal(result.compressed, true, JSON.stringify(result));
    assert.ok(result.afterTokens < result.beforeTokens);
    assert.equal(progress[0]?.kind, "begin");
    assert.equal(progress[progress.length - 1]?.kind, "end");
    const note = await compressed;
    assert.equal(note.method, "context/compressed");
    const checkpointNote = await created;
    assert.equal(checkpointNote.method, "checkpoint/created");

    const { checkpoints } = await client.checkpoints(session.sessionId);
    assert.ok(checkpoints.length >= 1);
    const first = checkpoints[0];
    const expanded = await client.expandCheckpoint(session.sessionId, first.id);
    assert.equal(expanded.checkpoint.id, first.id);
    assert.ok(expanded.messages.length > 0);
    for (const m of expanded.messages) {
      assert.ok(m.seq >= first.seqFrom && m.seq <= first.seqTo);
    }
  });

  it("compresses by itself when a push passes the trigger", async () => {
    const session = await client.createSession({ title: "auto", contextWindow: 8192 });
    const compressed = waitFor(client, (n) => n.method === "context/compressed" && n.params.sessionId === session.sessionId);
    for (let i = 0; i < 20; i++) {
      await client.push(session.sessionId, agentTurns(1, i));
    }
    const note = await compressed;
    assert.equal(note.method, "context/compressed");
    if (note.method === "context/compressed") {
      // "auto" is the default, left out of the frame.
      assert.equal(note.params.trigger ?? "auto", "auto");
    }
    const stats = await client.stats(session.sessionId);
    assert.ok(stats.compressionCount >= 1);
    // The prompt handed out always fits; the figures between pushes may be past the
    // limit while the next background pass (the trigger sits at 95%) is still running.
    const prompt = await client.prompt(session.sessionId);
    assert.ok(prompt.tokens <= prompt.budget.maxPromptTokens);
  });

  it("snapshots, restores, pins, sets the goal and locks a decision", async () => {
    const session = await client.createSession({ title: "controls" });
    await client.push(session.sessionId, [{ role: "user", content: "Use PostgreSQL, not MySQL." }]);
    const snap = await client.snapshot(session.sessionId, "before");
    assert.equal(snap.label, "before");
    await client.push(session.sessionId, [{ role: "assistant", content: "Switched to MySQL anyway." }]);
    const restored = waitFor(client, (n) => n.method === "snapshot/restored" && n.params.sessionId === session.sessionId);
    const restore = await client.restoreSnapshot(session.sessionId, snap.snapshotId);
    assert.equal(restore.snapshotId, snap.snapshotId);
    await restored;
    const prompt = await client.prompt(session.sessionId);
    assert.deepEqual(prompt.messages.map((m) => m.content), ["Use PostgreSQL, not MySQL."]);
    const snapshots = await client.listSnapshots(session.sessionId);
    assert.ok(snapshots.snapshots.some((s) => s.snapshotId === restore.backupSnapshotId));

    const pin = await client.pin(session.sessionId, 1);
    assert.equal(pin.pinned, true);
    assert.deepEqual((await client.stats(session.sessionId)).pinned, [1]);

    await client.setGoal(session.sessionId, "Ship the storage layer");
    const locked = await client.lockDecision(session.sessionId, "Use PostgreSQL");
    assert.equal(locked.goal?.description, "Ship the storage layer");
    assert.deepEqual(locked.goal?.decisions?.map((d) => [d.description, d.locked]), [["Use PostgreSQL", true]]);

    const exported = await client.exportSession(session.sessionId, "markdown");
    assert.match(exported.document, /PostgreSQL/);
    const deleted = await client.deleteSession(session.sessionId);
    assert.equal(deleted.sessionId, session.sessionId);
    await assert.rejects(client.stats(session.sessionId),
      (err: unknown) => err instanceof CtxdRequestError && err.code === ErrorCodes.SessionNotFound);
  });
});
