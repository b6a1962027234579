/** The pure UI logic: status bar text and level, labels, notification messages, documents. */
import { describe, it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { Budget, Checkpoint, CtxdNotification, HistoryEntry, NOTIFICATION_METHODS } from "../src/protocol/types";
import {
  NotifyPrefs, budgetLevel, checkpointLabel, describeNotification, documentPath, formatTokens, messageText,
  parseDocumentPath, renderContext, statusView,
} from "../src/ui/model";

function budget(over: Partial<Budget>): Budget {
  return {
    contextWindow: 8192, usableFraction: 0.9, usable: 7372, reservedOutput: 1024, safetyMargin: 100,
    maxPromptTokens: 6348, systemTokens: 0, pinnedTokens: 0, checkpointTokens: 0, available: 6248,
    triggerFraction: 0.75, triggerAt: 4686, used: 1000, promptTokens: 1003, free: 5345, ...over,
  };
}

const all: NotifyPrefs = { compression: true, overflow: true, reliability: true, threshold: true };
const none: NotifyPrefs = { compression: false, overflow: false, reliability: false, threshold: false };

/** A session's bill as `context/stats` gives it: 31 requests, 29 of them reported by the provider. */
const sessionBill = {
  provider: "anthropic", cache: "breakpoints", requests: 31, measured: 29,
  ctxd: { uncached: 12, cacheWrite: 40312, cacheRead: 512044, billed: 101_606.4, usd: 0.3048 },
  direct: { uncached: 0, cacheWrite: 52100, cacheRead: 1204503, billed: 185_575.3, usd: 0.5567 },
  ratio: 0.5475, passes: 0, passCost: 0, lastRequest: null,
};

describe("status bar", () => {
  it("shows the prompt against maxPromptTokens", () => {
    const view = statusView({ connection: "connected", session: { sessionId: "s1", title: "fix the parser" }, budget: budget({}) });
    assert.equal(view.text, "$(database) 1k/6.3k");
    assert.equal(view.level, "ok");
    assert.match(view.tooltip, /fix the parser/);
    assert.match(view.tooltip, /prompt 1003 of 6348 tokens \(16%\)/);
  });

  it("is at the trigger once the conversation passes triggerAt, and overflows past maxPromptTokens", () => {
    assert.equal(budgetLevel(budget({ used: 4685 })), "ok");
    assert.equal(budgetLevel(budget({ used: 4686 })), "trigger");
    assert.equal(budgetLevel(budget({ used: 4686, promptTokens: 6349 })), "overflow");
    assert.equal(budgetLevel(budget({}), true), "overflow");
    const trigger = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({ used: 5000, promptTokens: 5003 }) });
    assert.equal(trigger.level, "trigger");
    assert.equal(trigger.text, "$(warning) 5k/6.3k");
    const overflow = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({ promptTokens: 7000 }) });
    assert.equal(overflow.level, "overflow");
    assert.match(overflow.text, /^\$\(error\) 7k\/6.3k$/);
    const compressing = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({}), compressing: { stage: "summarization", percentage: 25 } });
    assert.match(compressing.text, /^\$\(sync~spin\)/);
    assert.match(compressing.tooltip, /summarization 25%/);
  });

  it("says when ctxd is not running, reconnecting, or has no session", () => {
    const failed = statusView({ connection: "failed", problem: "ctxd is not installed." });
    assert.equal(failed.level, "offline");
    assert.match(failed.tooltip, /not installed/);
    const down = statusView({ connection: "disconnected", problem: "ctxd exited (signal SIGKILL)" });
    assert.match(down.tooltip, /reconnecting \(ctxd exited/);
    assert.equal(statusView({ connection: "connected" }).level, "idle");
  });

  it("shows what the session's requests were billed, against going direct", () => {
    const bill = {
      ...sessionBill, passes: 3, passCost: 21400,
      budgetNote: "the window is 48,000 tokens of claude-sonnet-4-5's 200,000: 3 compression passes so far",
    };
    const view = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({}), bill });
    assert.match(view.tooltip, /estimated: billed 102k input tokens \(\$0\.3048\) over 31 requests, 0\.55× direct/);
    assert.match(view.tooltip, /read 512k from anthropic's cache, wrote 40k, uncached 12/);
    assert.match(view.tooltip, /3 compressions billed 21k again/);
    assert.match(view.tooltip, /48,000 tokens of claude-sonnet-4-5's 200,000/);
    const none = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({}),
      bill: { ...bill, requests: 0 } });
    assert.doesNotMatch(none.tooltip, /billed/);
    // No request the provider reported yet: nothing claims to be the provider's.
    assert.doesNotMatch(view.tooltip, /provider reported/);
  });

  it("shows what the provider reported beside ctxd's estimate of the same requests", () => {
    const bill = {
      ...sessionBill,
      reported: { uncached: 2210, cacheWrite: 61000, cacheRead: 431000, billed: 121_560.5, usd: 0.3647 },
      reportedEstimate: 95_100.2,
    };
    const lines = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({}), bill })
      .tooltip.split("\n");
    const estimated = lines.findIndex((l) => l.startsWith("estimated: billed 102k input tokens"));
    const reported = lines.findIndex((l) => l.startsWith("provider reported "));
    assert.ok(estimated >= 0 && reported > estimated, lines.join("\n"));
    assert.equal(lines[reported], "provider reported 29 requests: billed 122k ($0.3647) (ctxd estimated 95k)");
    assert.equal(lines[reported + 1], "  read 431k from anthropic's cache, wrote 61k, uncached 2.2k");
    // Small figures are exact; a provider that reported no cache reads says so.
    const small = statusView({ connection: "connected", session: { sessionId: "s" }, budget: budget({}), bill: {
      ...bill, requests: 2, measured: 1, reported: { uncached: 476, billed: 476 }, reportedEstimate: 470.4 } });
    assert.ok(small.tooltip.includes("\nprovider reported 1 requests: billed 476 (ctxd estimated 470)\n" +
      "  read 0 from anthropic's cache, wrote 0, uncached 476\n"), small.tooltip);
  });

  it("formats token counts briefly", () => {
    assert.deepEqual([0, 999, 1000, 1050, 9999, 12345, 128000, 1_500_000].map(formatTokens),
      ["0", "999", "1k", "1.1k", "10k", "12k", "128k", "1.5M"]);
  });
});

describe("labels and documents", () => {
  it("labels a checkpoint with level, size and ranges", () => {
    const c = { id: "c1", kind: "summary", level: "moderate", seqFrom: 3, seqTo: 40, messageRanges: [[3, 20], [22, 40]], tokens: 1234 } as Checkpoint;
    assert.deepEqual(checkpointLabel(c), { label: "moderate summary", description: "1.2k tok · #3–20, #22–40" });
  });

  it("round-trips document URIs", () => {
    for (const doc of [
      { kind: "message", sessionId: "a b/c", seq: 12 },
      { kind: "checkpoint", sessionId: "s", checkpointId: "ck-1" },
      { kind: "prompt", sessionId: "s", format: "anthropic" },
    ] as const) {
      assert.deepEqual(parseDocumentPath(documentPath(doc)), doc);
    }
    assert.equal(parseDocumentPath("/prompt/s/gemini.json"), undefined);
  });

  it("renders a hit in its context, marked, with tool calls as text", () => {
    const entries: HistoryEntry[] = [
      { seq: 4, createdAt: "", tokens: 3, status: "compressed", message: { role: "user", content: "read it" } },
      { seq: 5, createdAt: "", tokens: 3, status: "context", message: { role: "assistant", content: null, toolCalls: [{ id: "t", function: { name: "read_file", arguments: "{\"path\":\"a.py\"}" } }] } },
    ];
    const text = renderContext({ sessionId: "s", title: "T" }, entries, 5);
    assert.match(text, /### #4 user \(compressed\)/);
    assert.match(text, /### #5 assistant ◀ hit\n\n→ read_file\(\{"path":"a.py"\}\)/);
    assert.equal(messageText({ role: "user", content: [{ type: "text", text: "a" }, { type: "thinking", thinking: "b" }] }), "a\n\n(thinking) b");
  });
});

describe("notifications as messages", () => {
  const compressed: CtxdNotification = {
    method: "context/compressed",
    params: { sessionId: "s", layers: ["summarize"], beforeTokens: 9000, afterTokens: 3000, freedTokens: 6000, ratio: 0.33, checkpointIds: [], durationMs: 5, compressionNumber: 1 },
  };
  const overflow: CtxdNotification = {
    method: "context/overflow",
    params: { sessionId: "s", policy: "error", promptTokens: 9000, maxPromptTokens: 6000, systemTokens: 8000, pinnedTokens: 0, checkpointTokens: 0, userTokens: 900, action: "refused", reason: "prompt" },
  };
  const folded: CtxdNotification = {
    method: "context/overflow",
    params: { sessionId: "s", policy: "fold", promptTokens: 5000, maxPromptTokens: 6000, systemTokens: 100, pinnedTokens: 0, checkpointTokens: 900, userTokens: 3100, action: "folded 2 user messages (messages 3, 7) into checkpoint ckpt_1; checkpoint/expand ckpt_1 returns them", reason: "user_share", foldedMessages: 2, foldedSeqs: [3, 7], checkpointId: "ckpt_1" },
  };
  const reliability: CtxdNotification = {
    method: "context/reliability",
    params: { sessionId: "s", previousLevel: "high", reliability: { score: 0.4, level: "low", modelFactor: 1, compressionPenalty: 0.5, contextConfidence: 0.8, compressionCount: 4, modelSizeBillions: null, recommendations: ["Start a new session."] } },
  };

  it("follows the settings", () => {
    assert.deepEqual(describeNotification(compressed, all, "T"), { severity: "info", text: "ctxd compressed \"T\": 9k → 3k tokens (summarize)." });
    assert.equal(describeNotification(compressed, none, "T"), undefined);
    assert.equal(describeNotification(overflow, all, "T")?.severity, "error");
    assert.equal(describeNotification(overflow, none, "T"), undefined);
    // A fold past the user's share is no error: the prompt fits; it says which and how to get them back.
    assert.deepEqual(describeNotification(folded, all, "T"), { severity: "info", text: "ctxd folded user messages of \"T\": folded 2 user messages (messages 3, 7) into checkpoint ckpt_1; checkpoint/expand ckpt_1 returns them." });
    assert.deepEqual(describeNotification(reliability, all, "T"),
      { severity: "warning", text: "ctxd reliability of \"T\": high → low (0.40). Start a new session." });
    assert.equal(describeNotification(reliability, none, "T"), undefined);
    assert.equal(describeNotification({ method: "session/updated", params: { sessionId: "s", reason: "push", lastSeq: 1, messageCount: 1, tokenCount: 1, contextTokens: 1 } }, all, "T"), undefined);
  });
});

describe("protocol types", () => {
  it("know every session notification protocol/schema.json lists", () => {
    const schema = JSON.parse(fs.readFileSync(path.resolve(__dirname, "..", "..", "..", "..", "protocol", "schema.json"), "utf8")) as {
      notifications: Record<string, { direction: string }>;
    };
    const fromServer = Object.entries(schema.notifications)
      .filter(([method, n]) => n.direction === "server->client" && method !== "$/progress")
      .map(([method]) => method)
      .sort();
    assert.deepEqual([...NOTIFICATION_METHODS].sort(), fromServer);
  });
});

describe("layering", () => {
  it("keeps vscode out of the protocol client and the API", () => {
    const src = path.resolve(__dirname, "..", "..", "src");
    const files = [...fs.readdirSync(path.join(src, "protocol")).map((f) => path.join(src, "protocol", f)), path.join(src, "api.ts"),
      path.join(src, "ui", "model.ts"), path.join(src, "ui", "active.ts")];
    for (const file of files) {
      assert.doesNotMatch(fs.readFileSync(file, "utf8"), /from "vscode"|require\("vscode"\)/, file);
    }
  });
});
