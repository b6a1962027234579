/**
 * The UI modules against the fake `vscode` module and a real ctxd: the status bar's
 * text and colour as a session fills, the tree, the commands' effects in ctxd (with
 * their confirmations), search and the read-only documents, activation.
 */
import "./fake/register";
import { after, afterEach, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "fs";
import * as path from "path";
import { CtxdClient } from "../src/protocol/client";
import { CtxdSupervisor } from "../src/protocol/supervisor";
import { CtxdNotification, Message, SessionInfo } from "../src/protocol/types";
import { ActiveSession } from "../src/ui/active";
import { Commands } from "../src/ui/commands";
import { CtxdDocuments } from "../src/ui/documents";
import { SCHEME, formatTokens } from "../src/ui/model";
import { showNotification } from "../src/ui/notifications";
import { StatusBar } from "../src/ui/statusBar";
import { Node, SessionsTree } from "../src/ui/tree";
import { TestDaemon, agentTurns, ctxdBinary, testDaemon } from "./daemon";
import * as vscode from "./fake/vscode";

const { ui, fake } = vscode;

function until(supervisor: CtxdSupervisor, accept: (n: CtxdNotification) => boolean): Promise<CtxdNotification> {
  return new Promise((resolve) => {
    const sub = supervisor.onNotification((n) => {
      if (accept(n)) {
        sub.dispose();
        resolve(n);
      }
    });
  });
}

/** Answer the next dialog with `value` (a function gets the dialog's arguments). */
function reply(value: unknown): void {
  ui.answers.push(typeof value === "function" ? (value as (kind: string, ...args: unknown[]) => unknown) : () => value);
}

/** Pick the quick pick item whose label/value matches. */
function pickWhere(match: (item: { label: string; value?: unknown }) => boolean): void {
  reply((_kind: string, items: unknown) => (items as { label: string; value?: unknown }[]).find(match));
}

describe("UI against ctxd", () => {
  let daemon: TestDaemon;
  let supervisor: CtxdSupervisor;
  let client: CtxdClient;
  let active: ActiveSession;
  let tree: SessionsTree;
  let documents: CtxdDocuments;
  let status: StatusBar;
  let disposables: { dispose(): void }[];

  before(async () => {
    daemon = testDaemon();
    supervisor = new CtxdSupervisor({ resolveCommand: () => daemon.command });
    active = new ActiveSession();
    supervisor.onNotification((n) => active.observe(n));
    tree = new SessionsTree(supervisor, active, () => 50);
    documents = new CtxdDocuments(supervisor);
    status = new StatusBar(supervisor, active);
    const commands = new Commands({
      supervisor, active, tree, documents, output: vscode.window.createOutputChannel("ctxd") as unknown as import("vscode").OutputChannel,
      promptFormat: () => "anthropic",
    });
    disposables = [...commands.register(), vscode.workspace.registerTextDocumentContentProvider(SCHEME, documents)];
    supervisor.start();
    client = await supervisor.ready();
  });

  afterEach(() => ui.reset());

  after(async () => {
    disposables.forEach((d) => d.dispose());
    status.dispose();
    tree.dispose();
    documents.dispose();
    await supervisor.stop();
    daemon.remove();
  });

  async function session(params: Parameters<CtxdClient["createSession"]>[0], messages: Message[] = []): Promise<SessionInfo> {
    const info = await client.createSession(params);
    if (messages.length) {
      await client.push(info.sessionId, messages);
    }
    return info;
  }

  it("status bar: follows the pushed session, live, and colours at the trigger", async () => {
    const s = await session({ title: "status", contextWindow: 8192, settings: { autoCompress: false, triggerFraction: 0.8 } });
    let pushed = until(supervisor, (n) => n.method === "session/updated" && n.params.sessionId === s.sessionId);
    let result = await client.push(s.sessionId, [{ role: "user", content: "hello there" }]);
    await pushed;
    await status.refresh();
    assert.equal(active.sessionId, s.sessionId);
    const item = status.item as unknown as vscode.FakeStatusBarItem;
    const color = (): string | undefined => item.backgroundColor?.id;
    assert.equal(item.text, `$(database) ${formatTokens(result.budget.promptTokens)}/${formatTokens(result.budget.maxPromptTokens)}`);
    assert.equal(color(), undefined);
    assert.equal(item.command, "ctxd.pickSession");
    assert.match(item.tooltip ?? "", /status/);

    // Automatic compression is off: pushing past the trigger (0.8 of available, so the prompt still
    // fits) leaves it there, in the warning colour.
    let turn = 0;
    while (result.budget.used < result.budget.triggerAt) {
      pushed = until(supervisor, (n) => n.method === "session/updated" && n.params.sessionId === s.sessionId && n.params.lastSeq >= result.messages[0].seq + 4);
      result = await client.push(s.sessionId, agentTurns(1, turn++));
      await pushed;
    }
    await status.refresh();
    assert.equal(status.view().level, "trigger");
    assert.equal(color(), "statusBarItem.warningBackground");
    assert.match(item.text, /^\$\(warning\) /);

    // Compressing brings it back under the trigger: the compression notification refreshes it.
    const compressed = until(supervisor, (n) => n.method === "context/compressed" && n.params.sessionId === s.sessionId);
    await client.compress(s.sessionId);
    await compressed;
    await status.refresh();
    const stats = await client.stats(s.sessionId);
    assert.equal(status.view().level, stats.budget.used >= stats.budget.triggerAt ? "trigger" : "ok");
    assert.ok(item.text.endsWith(` ${formatTokens(stats.budget.promptTokens)}/${formatTokens(stats.budget.maxPromptTokens)}`), item.text);
    assert.ok(stats.budget.promptTokens < result.budget.promptTokens);
  });

  it("status bar: red when what may never be compressed does not fit", async () => {
    const huge = Array.from({ length: 1500 }, (_, i) => `Rule ${i}: never do thing ${i}.`).join("\n");
    const s = await session({ title: "overflow", contextWindow: 4096, systemPrompt: huge });
    active.pick(s.sessionId);
    await status.refresh();
    const stats = await client.stats(s.sessionId);
    assert.ok(stats.budget.promptTokens > stats.budget.maxPromptTokens, JSON.stringify(stats.budget));
    const item = status.item as unknown as vscode.FakeStatusBarItem;
    assert.equal(status.view().level, "overflow");
    assert.equal(item.backgroundColor?.id, "statusBarItem.errorBackground");
    active.follow(undefined);
  });

  it("status bar: the bill as ctxd estimated it, then what the provider reported beside", async () => {
    const s = await session({ title: "billed", model: "gpt-4o", contextWindow: 128_000 },
      [{ role: "user", content: "List the files of the parser, then explain what each one does." }, ...agentTurns(6)]);
    active.pick(s.sessionId);
    // A request the provider reports nothing of (no usage on the reply): ctxd's estimate only.
    await client.prompt(s.sessionId, "openai");
    await client.push(s.sessionId, [{ role: "assistant", content: "Here they are." },
      { role: "user", content: "Now the tests." }]);
    await status.refresh();
    let stats = await client.stats(s.sessionId);
    assert.equal(stats.bill?.measured ?? 0, 0, JSON.stringify(stats.bill));
    let tooltip = status.view().tooltip;
    assert.match(tooltip, new RegExp(`\nestimated: billed ${formatTokens(Math.round(stats.bill?.ctxd?.billed ?? 0))} input tokens .* over 1 requests`));
    assert.doesNotMatch(tooltip, /provider reported/);

    // The next reply carries the provider's usage: it is shown beside ctxd's estimate of that request.
    await client.prompt(s.sessionId, "openai");
    await client.push(s.sessionId, [{ role: "assistant", content: "The tests pass.",
      usage: { inputTokens: 1500, cachedInputTokens: 1024, outputTokens: 5 } }]);
    await status.refresh();
    stats = await client.stats(s.sessionId);
    const bill = stats.bill;
    assert.ok(bill && bill.measured === 1 && bill.reported && bill.reportedEstimate, JSON.stringify(bill));
    assert.equal(bill.reported.uncached, 476);
    tooltip = status.view().tooltip;
    assert.match(tooltip, /\nestimated: billed .* over 2 requests/);
    const line = `provider reported 1 requests: billed ${formatTokens(Math.round(bill.reported.billed ?? 0))}`;
    assert.ok(tooltip.includes(`\n${line}`), tooltip);
    assert.ok(tooltip.includes(`(ctxd estimated ${formatTokens(Math.round(bill.reportedEstimate))})\n` +
      "  read 1k from openai's cache, wrote 0, uncached 476"), tooltip);
    active.follow(undefined);
  });

  it("session picker: the status bar shows the session picked", async () => {
    const s = await session({ title: "picked one" }, [{ role: "user", content: "pick me" }]);
    pickWhere((i) => i.value === s.sessionId);
    await vscode.commands.executeCommand("ctxd.pickSession");
    assert.equal(active.sessionId, s.sessionId);
    assert.equal(active.following, false);
    await status.refresh();
    assert.match(status.view().tooltip, /picked one/);
    pickWhere((i) => i.value === undefined);
    await vscode.commands.executeCommand("ctxd.pickSession");
    assert.equal(active.following, true);
  });

  it("tree: sessions, goal, checkpoints and snapshots", async () => {
    const s = await session({ title: "tree" }, agentTurns(10));
    await client.setGoal(s.sessionId, "Fix every parser bug");
    await client.lockDecision(s.sessionId, "Keep the public API");
    await client.compress(s.sessionId);
    await client.snapshot(s.sessionId, "after compress");

    const roots = await tree.getChildren();
    const node = roots.find((n) => n.type === "session" && n.session.sessionId === s.sessionId);
    assert.ok(node);
    const sessionItem = tree.getTreeItem(node);
    assert.equal(sessionItem.label, "tree");
    assert.equal(sessionItem.contextValue, "session");
    assert.match(String(sessionItem.description), /^40 msgs · /);

    const [goal, checkpoints, snapshots] = await tree.getChildren(node);
    assert.equal(tree.getTreeItem(goal).label, "Goal: Fix every parser bug");
    const [decision] = await tree.getChildren(goal);
    const decisionItem = tree.getTreeItem(decision);
    assert.equal(decisionItem.label, "Keep the public API");
    assert.equal((decisionItem.iconPath as unknown as vscode.ThemeIcon).id, "lock");

    const cps = await tree.getChildren(checkpoints);
    const { checkpoints: expected } = await client.checkpoints(s.sessionId);
    assert.equal(cps.length, expected.length);
    const cpItem = tree.getTreeItem(cps[0]);
    assert.equal(cpItem.label, `${expected[0].level} ${expected[0].kind}`);
    assert.match(String(cpItem.description), new RegExp(`tok · #${expected[0].messageRanges[0][0]}`));
    assert.equal(cpItem.command?.command, "ctxd.expandCheckpoint");

    const snaps = await tree.getChildren(snapshots);
    assert.ok(snaps.some((n) => n.type === "snapshot" && tree.getTreeItem(n).label === "after compress"));
    assert.equal(tree.titleOf(s.sessionId), "tree");
  });

  it("restore asks first, and does nothing when refused", async () => {
    const s = await session({ title: "restore" }, [{ role: "user", content: "first" }]);
    const snap = await client.snapshot(s.sessionId, "one");
    await client.push(s.sessionId, [{ role: "user", content: "second" }]);
    const node: Node = { type: "snapshot", sessionId: s.sessionId, snapshot: snap };

    reply(undefined); // the modal dialog dismissed
    await vscode.commands.executeCommand("ctxd.restore", node);
    const [confirm] = ui.called("showWarningMessage");
    assert.match(String(confirm.args[0]), /Restore "one" in restore\?/);
    assert.deepEqual((confirm.args[1] as { modal: boolean }).modal, true);
    assert.equal((await client.prompt(s.sessionId)).messages.length, 2);

    reply("Restore");
    await vscode.commands.executeCommand("ctxd.restore", node);
    assert.deepEqual((await client.prompt(s.sessionId)).messages.map((m) => m.content), ["first"]);
    assert.match(String(ui.called("showInformationMessage")[0].args[0]), /restored "one"/);
  });

  it("compress reports $/progress; snapshot, pin, goal and decision from their dialogs", async () => {
    const s = await session({ title: "controls" }, agentTurns(8));
    const node: Node = { type: "session", session: s };
    await vscode.commands.executeCommand("ctxd.compress", node);
    const [progress] = ui.called("withProgress");
    const reports = progress.args[1] as { increment?: number }[];
    assert.ok(reports.length >= 1);
    assert.equal(reports.reduce((sum, r) => sum + (r.increment ?? 0), 0), 100);
    assert.match(String(ui.called("showInformationMessage")[0].args[0]), /compressed/);
    assert.ok((await client.stats(s.sessionId)).compressionCount >= 1);

    reply("my label");
    await vscode.commands.executeCommand("ctxd.snapshot", node);
    assert.ok((await client.listSnapshots(s.sessionId)).snapshots.some((x) => x.label === "my label"));

    reply((_k: string, options: unknown) => {
      const validate = (options as { validateInput: (v: string) => string | undefined }).validateInput;
      assert.match(validate("0") ?? "", /from 1 to 32/);
      assert.equal(validate("3"), undefined);
      return "3";
    });
    await vscode.commands.executeCommand("ctxd.pin", node);
    // A tool result is pinned with the call it answers (#2).
    assert.deepEqual((await client.stats(s.sessionId)).pinned, [2, 3]);
    assert.match(String(ui.called("showInformationMessage").at(-1)?.args[0]), /message #3 pinned/);

    // Without a goal, locking a decision says to set one first.
    await vscode.commands.executeCommand("ctxd.lockDecision", node);
    assert.match(String(ui.called("showWarningMessage")[0].args[0]), /set a goal first/);

    reply("Parse every file");
    await vscode.commands.executeCommand("ctxd.setGoal", node);
    reply("Never touch the lexer");
    await vscode.commands.executeCommand("ctxd.lockDecision", node);
    const { goal } = await client.getGoal(s.sessionId);
    assert.equal(goal?.description, "Parse every file");
    assert.deepEqual(goal?.decisions?.map((d) => [d.description, d.locked]), [["Never touch the lexer", true]]);
  });

  it("expands a checkpoint into its messages in a read-only document", async () => {
    const s = await session({ title: "expand" }, agentTurns(8));
    await client.compress(s.sessionId);
    const { checkpoints } = await client.checkpoints(s.sessionId);
    await vscode.commands.executeCommand("ctxd.expandCheckpoint", { type: "checkpoint", sessionId: s.sessionId, checkpoint: checkpoints[0] });
    const [shown] = ui.called("showTextDocument");
    const doc = shown.args[0] as vscode.FakeDocument;
    assert.equal(doc.uri.scheme, "ctxd");
    const text = doc.getText();
    assert.match(text, /## Original messages/);
    assert.match(text, new RegExp(`### #${checkpoints[0].seqFrom} `));
    assert.match(text, /Step 0: look at module 0/);
  });

  it("exports to the file chosen, and deletes only when confirmed", async () => {
    const s = await session({ title: "export me" }, [{ role: "user", content: "the pelican brief" }]);
    const node: Node = { type: "session", session: s };
    const target = path.join(daemon.root, "exported.md");
    pickWhere((i) => i.value === "markdown");
    reply(vscode.Uri.file(target));
    await vscode.commands.executeCommand("ctxd.export", node);
    assert.match(fs.readFileSync(target, "utf8"), /the pelican brief/);

    reply(undefined);
    await vscode.commands.executeCommand("ctxd.delete", node);
    assert.equal((await client.getSession(s.sessionId)).sessionId, s.sessionId);
    reply("Delete");
    await vscode.commands.executeCommand("ctxd.delete", node);
    await assert.rejects(client.getSession(s.sessionId));
  });

  it("palette commands ask which session, the active one first", async () => {
    const s = await session({ title: "palette" }, [{ role: "user", content: "x" }]);
    active.pick(s.sessionId);
    reply((_k: string, items: unknown) => {
      const list = items as { value: string; description: string }[];
      assert.equal(list[0].value, s.sessionId);
      assert.match(list[0].description, /active/);
      return undefined; // cancelled: nothing happens
    });
    await vscode.commands.executeCommand("ctxd.snapshot");
    assert.equal(ui.called("showInputBox").length, 0);
    assert.equal((await client.listSnapshots(s.sessionId)).snapshots.length, 0);
    active.follow(undefined);
  });

  it("searches across sessions and opens the hit in its context", async () => {
    const a = await session({ title: "search a" }, [
      { role: "user", content: "before" }, { role: "user", content: "the capybara migration broke" }, { role: "assistant", content: "after" },
    ]);
    const done = vscode.commands.executeCommand("ctxd.search");
    const [shown] = ui.called("createQuickPick.show");
    const pick = shown.args[0] as vscode.FakeQuickPick<{ label: string; value: { sessionId: string; seq: number } }>;
    const loaded = new Promise<void>((resolve) => {
      const sub = pick.idle.event(() => {
        sub.dispose();
        resolve();
      });
    });
    pick.type("capybara");
    await loaded;
    const hit = pick.items.find((i) => i.value.sessionId === a.sessionId);
    assert.ok(hit, JSON.stringify(pick.items));
    assert.equal(hit.value.seq, 2);
    pick.selectedItems = [hit];
    pick.accept.fire();
    await done;
    const doc = ui.called("showTextDocument")[0].args[0] as vscode.FakeDocument;
    assert.match(doc.getText(), /### #1 user\n\nbefore/);
    assert.match(doc.getText(), /### #2 user ◀ hit\n\nthe capybara migration broke/);
    assert.match(doc.getText(), /### #3 assistant\n\nafter/);
  });

  it("previews the prompt in a provider format, refreshed when the session changes", async () => {
    const s = await session({ title: "preview", systemPrompt: "Be brief." }, [{ role: "user", content: "one" }]);
    active.pick(s.sessionId);
    pickWhere((i) => i.value === "anthropic");
    await vscode.commands.executeCommand("ctxd.showPrompt");
    const [formats] = ui.called("showQuickPick");
    assert.equal((formats.args[0] as { value: string }[])[0].value, "anthropic"); // ctxd.promptFormat first
    const doc = ui.called("showTextDocument")[0].args[0] as vscode.FakeDocument;
    const before = JSON.parse(doc.getText()) as { system: unknown; messages: unknown[]; ctxd: { format: string } };
    assert.equal(before.ctxd.format, "anthropic");
    assert.equal(before.messages.length, 1);
    assert.ok(before.system);

    const changed = new Promise<string>((resolve) => {
      const sub = documents.onDidChange((uri) => {
        sub.dispose();
        resolve(uri.toString());
      });
    });
    await client.push(s.sessionId, [{ role: "assistant", content: "two" }]);
    assert.equal(await changed, doc.uri.toString());
    const after = JSON.parse(await documents.provideTextDocumentContent(doc.uri as unknown as import("vscode").Uri)) as { messages: unknown[] };
    assert.equal(after.messages.length, 2);
    active.follow(undefined);
  });

  it("previews the prompt as a look: ctxd neither bills nor counts it as a request", async () => {
    const s = await session({ title: "look", provider: "anthropic", model: "claude-sonnet-4-5", systemPrompt: "Be brief." },
      [{ role: "user", content: "one" }]);
    active.pick(s.sessionId);
    pickWhere((i) => i.value === "anthropic");
    await vscode.commands.executeCommand("ctxd.showPrompt");
    const doc = ui.called("showTextDocument")[0].args[0] as vscode.FakeDocument;
    assert.equal((JSON.parse(doc.getText()) as { messages: unknown[] }).messages.length, 1);
    // The client sends its own request and pushes the reply with the provider's usage.
    const usage = { inputTokens: 40, outputTokens: 2 };
    await client.push(s.sessionId, [{ role: "assistant", content: "two", usage }]);
    const looked = await client.stats(s.sessionId);
    assert.equal(looked.bill?.requests, 0, JSON.stringify(looked.bill));
    assert.equal(looked.promptCache?.prompts, 0);
    // A prompt taken to send is a request: the reply after it is billed.
    await client.prompt(s.sessionId, "anthropic");
    await client.push(s.sessionId, [{ role: "user", content: "three" }, { role: "assistant", content: "four", usage }]);
    const sent = await client.stats(s.sessionId);
    assert.equal(sent.bill?.requests, 1, JSON.stringify(sent.bill));
    assert.equal(sent.promptCache?.prompts, 1);
    active.follow(undefined);
  });

  it("shows notifications as messages, as configured", async () => {
    const n: CtxdNotification = { method: "snapshot/error", params: { sessionId: "s", operation: "create", reason: "disk full" } };
    await showNotification(n, { compression: false, overflow: true, reliability: true, threshold: false }, "T");
    assert.match(String(ui.called("showErrorMessage")[0].args[0]), /snapshot create failed for "T": disk full/);
  });
});

describe("activate", () => {
  it("starts ctxd from the settings and returns the exports API", async () => {
    const ext = await import("../src/extension");
    const d = testDaemon();
    ui.settings.set("ctxd.path", ctxdBinary());
    ui.settings.set("ctxd.args", d.command.args);
    const context = { subscriptions: [] as { dispose(): void }[] };
    try {
      const api = ext.activate(context as unknown as import("vscode").ExtensionContext);
      assert.equal(api.apiVersion, 1);
      const s = await api.createSession({ title: "from another extension" });
      const seen: string[] = [];
      const updated = new Promise<void>((resolve) => {
        const sub = api.subscribe(s.sessionId, (n) => {
          seen.push(n.method);
          if (n.method === "session/updated") {
            sub.dispose();
            resolve();
          }
        });
      });
      const pushed = await api.push(s.sessionId, [{ role: "user", content: "hi" }]);
      assert.equal(pushed.messageCount, 1);
      await updated;
      assert.ok(seen.includes("session/updated"));
      assert.equal((await api.stats(s.sessionId)).messageCount, 1);
      assert.ok(fake.registered.has("ctxd.search"));
      assert.ok(ui.called("createTreeView").some((c) => c.args[0] === "ctxd.sessions"));
    } finally {
      await ext.deactivate();
      context.subscriptions.forEach((x) => x.dispose());
      ui.settings.clear();
      ui.reset();
      d.remove();
    }
  });

  it("shows what to do when ctxd is not installed", async () => {
    const ext = await import("../src/extension");
    ui.settings.set("ctxd.path", path.join(daemonlessDir(), "ctxd"));
    const context = { subscriptions: [] as { dispose(): void }[] };
    const shown = new Promise<string>((resolve) => {
      ui.answers.push((_kind: string, text: unknown) => {
        resolve(String(text));
        return undefined;
      });
    });
    try {
      const api = ext.activate(context as unknown as import("vscode").ExtensionContext);
      const text = await shown;
      assert.match(text, /ctxd\.path is ".*", which is not an executable file\./);
      assert.match(text, /pip install/);
      assert.deepEqual(ui.called("showErrorMessage")[0].args.slice(1), ["Open Settings", "Reconnect", "Show Log"]);
      await assert.rejects(api.stats("x"), /not an executable file/);
      const item = fake.statusItems[fake.statusItems.length - 1];
      assert.equal(item.command, "ctxd.showSetupHelp");
      assert.match(item.text, /\$\(error\)/);
    } finally {
      await ext.deactivate();
      context.subscriptions.forEach((x) => x.dispose());
      ui.settings.clear();
      ui.reset();
    }
  });
});

function daemonlessDir(): string {
  return path.join(path.sep, "nonexistent-ctxd-dir");
}
