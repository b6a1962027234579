/** The extension's commands (palette, view title and item menus, status bar). */
import * as vscode from "vscode";
import { CtxdClient } from "../protocol/client";
import { CtxdSupervisor } from "../protocol/supervisor";
import { ExportFormat, PromptFormat, SearchHit, WorkDoneProgress } from "../protocol/types";
import { ActiveSession } from "./active";
import { CtxdDocuments } from "./documents";
import { checkpointLabel, formatTokens, hitLabel, sessionDescription, sessionLabel, snapshotLabel } from "./model";
import { Node, SessionsTree, nodeSessionId } from "./tree";

export const COMMANDS = [
  "ctxd.pickSession", "ctxd.refresh", "ctxd.reconnect", "ctxd.showLog", "ctxd.showSetupHelp", "ctxd.compress",
  "ctxd.snapshot", "ctxd.restore", "ctxd.expandCheckpoint", "ctxd.pin", "ctxd.unpin", "ctxd.setGoal",
  "ctxd.lockDecision", "ctxd.export", "ctxd.delete", "ctxd.search", "ctxd.showPrompt",
] as const;
export type CommandId = (typeof COMMANDS)[number];

interface Picked<T> extends vscode.QuickPickItem {
  value: T;
}

export interface CommandDeps {
  supervisor: CtxdSupervisor;
  active: ActiveSession;
  tree: SessionsTree;
  documents: CtxdDocuments;
  output: vscode.OutputChannel;
  promptFormat: () => PromptFormat;
}

export class Commands {
  constructor(private readonly deps: CommandDeps) {}

  register(): vscode.Disposable[] {
    const handlers: Record<CommandId, (arg?: Node) => Promise<unknown>> = {
      "ctxd.pickSession": () => this.pickSession(),
      "ctxd.refresh": () => Promise.resolve(this.deps.tree.refresh()),
      "ctxd.reconnect": () => this.deps.supervisor.restart(),
      "ctxd.showLog": () => Promise.resolve(this.deps.output.show()),
      "ctxd.showSetupHelp": () => this.showSetupHelp(),
      "ctxd.compress": (n) => this.compress(n),
      "ctxd.snapshot": (n) => this.snapshot(n),
      "ctxd.restore": (n) => this.restore(n),
      "ctxd.expandCheckpoint": (n) => this.expandCheckpoint(n),
      "ctxd.pin": (n) => this.pin(n, true),
      "ctxd.unpin": (n) => this.pin(n, false),
      "ctxd.setGoal": (n) => this.setGoal(n),
      "ctxd.lockDecision": (n) => this.lockDecision(n),
      "ctxd.export": (n) => this.exportSession(n),
      "ctxd.delete": (n) => this.deleteSession(n),
      "ctxd.search": () => this.search(),
      "ctxd.showPrompt": (n) => this.showPrompt(n),
    };
    return COMMANDS.map((id) => vscode.commands.registerCommand(id, async (arg?: Node) => {
      try {
        return await handlers[id](arg);
      } catch (err) {
        const message = err instanceof Error ? err.message : String(err);
        this.deps.output.appendLine(`${id}: ${message}`);
        void vscode.window.showErrorMessage(`ctxd: ${message}`);
        return undefined;
      }
    }));
  }

  private client(): Promise<CtxdClient> {
    return this.deps.supervisor.ready();
  }

  /** A session's title for messages (asked of ctxd when the view has not listed it). */
  private async title(sessionId: string): Promise<string> {
    const known = this.deps.tree.titles.get(sessionId);
    if (known) {
      return known;
    }
    try {
      const label = sessionLabel(await (await this.client()).getSession(sessionId));
      this.deps.tree.titles.set(sessionId, label);
      return label;
    } catch {
      return sessionId;
    }
  }

  /** The session a command acts on: the node's, else one picked (the active one first). */
  private async sessionFor(node: Node | undefined, placeHolder: string): Promise<string | undefined> {
    const fromNode = nodeSessionId(node);
    if (fromNode) {
      return fromNode;
    }
    const client = await this.client();
    const { sessions } = await client.listSessions(100);
    if (!sessions.length) {
      void vscode.window.showInformationMessage("ctxd has no sessions yet.");
      return undefined;
    }
    const active = this.deps.active.sessionId;
    const items: Picked<string>[] = sessions
      .map((s) => ({ label: sessionLabel(s), description: `${sessionDescription(s)}${s.sessionId === active ? " · active" : ""}`, detail: s.sessionId, value: s.sessionId }))
      .sort((a, b) => Number(b.value === active) - Number(a.value === active));
    return (await vscode.window.showQuickPick(items, { placeHolder, matchOnDetail: true }))?.value;
  }

  async pickSession(): Promise<void> {
    const client = await this.client();
    const { sessions } = await client.listSessions(100);
    const follow: Picked<string | undefined> = {
      label: "$(pulse) Follow the latest session", description: "whichever session was pushed to last", value: undefined,
    };
    const items: Picked<string | undefined>[] = [follow, ...sessions.map((s) => ({
      label: sessionLabel(s), description: sessionDescription(s), detail: s.sessionId, value: s.sessionId,
    }))];
    const picked = await vscode.window.showQuickPick(items, { placeHolder: "The session the status bar and prompt preview show" });
    if (!picked) {
      return;
    }
    if (picked.value === undefined) {
      this.deps.active.follow(sessions[0]?.sessionId);
    } else {
      this.deps.active.pick(picked.value);
    }
  }

  async showSetupHelp(): Promise<void> {
    const state = this.deps.supervisor.state;
    const error = state.kind === "failed" ? state.error : undefined;
    const text = error ? `${error.problem} ${error.fix}` : `ctxd is ${state.kind}.`;
    const choice = await vscode.window.showErrorMessage(text, "Open Settings", "Reconnect", "Show Log");
    if (choice === "Open Settings") {
      await vscode.commands.executeCommand("workbench.action.openSettings", "ctxd");
    } else if (choice === "Reconnect") {
      await this.deps.supervisor.restart();
    } else if (choice === "Show Log") {
      this.deps.output.show();
    }
  }

  async compress(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Compress which session?");
    if (!sessionId) {
      return;
    }
    const client = await this.client();
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `ctxd: compressing ${await this.title(sessionId)}` },
      (progress) => {
        let last = 0;
        return client.compress(sessionId, {
          onProgress: (value: WorkDoneProgress) => {
            const percentage = value.kind === "end" ? 100 : value.percentage ?? last;
            progress.report({ message: value.message ?? undefined, increment: Math.max(0, percentage - last) });
            last = Math.max(last, percentage);
          },
        });
      });
    const text = result.compressed
      ? `ctxd compressed ${await this.title(sessionId)}: ${formatTokens(result.beforeTokens)} → ${formatTokens(result.afterTokens)} tokens.`
      : `ctxd did not compress ${await this.title(sessionId)}: ${result.reason ?? "nothing to compress"}.`;
    void vscode.window.showInformationMessage(text);
    this.deps.tree.refresh();
  }

  async snapshot(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Snapshot which session?");
    if (!sessionId) {
      return;
    }
    const label = await vscode.window.showInputBox({ prompt: "Snapshot label (optional)", placeHolder: "before the refactor" });
    if (label === undefined) {
      return;
    }
    const info = await (await this.client()).snapshot(sessionId, label.trim() || undefined);
    void vscode.window.showInformationMessage(`ctxd: snapshot ${info.label ?? info.snapshotId} taken at #${info.lastSeq}.`);
    this.deps.tree.refresh();
  }

  async restore(node?: Node): Promise<void> {
    const client = await this.client();
    let sessionId: string | undefined;
    let snapshotId: string | undefined;
    let label: string;
    if (node?.type === "snapshot") {
      sessionId = node.sessionId;
      snapshotId = node.snapshot.snapshotId;
      label = snapshotLabel(node.snapshot).label;
    } else {
      sessionId = await this.sessionFor(node, "Restore a snapshot of which session?");
      if (!sessionId) {
        return;
      }
      const { snapshots } = await client.listSnapshots(sessionId);
      if (!snapshots.length) {
        void vscode.window.showInformationMessage("This session has no snapshots.");
        return;
      }
      const picked = await vscode.window.showQuickPick(snapshots.map((s) => ({ ...snapshotLabel(s), value: s })),
        { placeHolder: "Restore which snapshot?" });
      if (!picked) {
        return;
      }
      snapshotId = picked.value.snapshotId;
      label = picked.label;
    }
    const answer = await vscode.window.showWarningMessage(
      `Restore "${label}" in ${await this.title(sessionId)}?`,
      { modal: true, detail: "The active context becomes the snapshot's. The current one is snapshotted first, and history keeps every message (later ones are marked rolled back)." },
      "Restore");
    if (answer !== "Restore") {
      return;
    }
    const result = await client.restoreSnapshot(sessionId, snapshotId);
    void vscode.window.showInformationMessage(`ctxd restored "${label}" (the previous context is snapshot ${result.backupSnapshotId}).`);
    this.deps.tree.refresh();
  }

  async expandCheckpoint(node?: Node): Promise<void> {
    if (node?.type === "checkpoint") {
      await this.deps.documents.open({ kind: "checkpoint", sessionId: node.sessionId, checkpointId: node.checkpoint.id });
      return;
    }
    const sessionId = await this.sessionFor(node, "Expand a checkpoint of which session?");
    if (!sessionId) {
      return;
    }
    const { checkpoints } = await (await this.client()).checkpoints(sessionId);
    if (!checkpoints.length) {
      void vscode.window.showInformationMessage("This session has no checkpoints (nothing was compressed).");
      return;
    }
    const picked = await vscode.window.showQuickPick(checkpoints.map((c) => ({ ...checkpointLabel(c), value: c.id })),
      { placeHolder: "Expand which checkpoint?" });
    if (picked) {
      await this.deps.documents.open({ kind: "checkpoint", sessionId, checkpointId: picked.value });
    }
  }

  async pin(node: Node | undefined, pinned: boolean): Promise<void> {
    const sessionId = await this.sessionFor(node, pinned ? "Pin a message of which session?" : "Unpin a message of which session?");
    if (!sessionId) {
      return;
    }
    const client = await this.client();
    const info = await client.getSession(sessionId);
    const input = await vscode.window.showInputBox({
      prompt: pinned ? "Pin message number (always sent verbatim)" : "Unpin message number",
      placeHolder: `1 to ${info.lastSeq}`,
      validateInput: (v) => (/^\d+$/.test(v.trim()) && Number(v) >= 1 && Number(v) <= info.lastSeq ? undefined : `A message number from 1 to ${info.lastSeq}`),
    });
    if (input === undefined) {
      return;
    }
    const result = await client.pin(sessionId, Number(input.trim()), pinned);
    void vscode.window.showInformationMessage(
      `ctxd: message #${result.seq} ${result.pinned ? "pinned" : "unpinned"} (${formatTokens(result.pinnedTokens)} pinned tokens).`);
  }

  async setGoal(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Set the goal of which session?");
    if (!sessionId) {
      return;
    }
    const client = await this.client();
    const current = await client.getGoal(sessionId);
    const description = await vscode.window.showInputBox({
      prompt: "The session's goal (replaces the current one)", value: current.goal?.description ?? "",
      validateInput: (v) => (v.trim() ? undefined : "Describe the goal"),
    });
    if (description === undefined) {
      return;
    }
    await client.setGoal(sessionId, description.trim());
    this.deps.tree.refresh();
  }

  async lockDecision(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Lock a decision in which session?");
    if (!sessionId) {
      return;
    }
    const client = await this.client();
    const { goal } = await client.getGoal(sessionId);
    if (!goal) {
      void vscode.window.showWarningMessage("Decisions belong to the session's goal: set a goal first (\"ctxd: Set Goal\").");
      return;
    }
    const description = await vscode.window.showInputBox({
      prompt: "A decision to keep in every prompt (locked)", placeHolder: "Use PostgreSQL, not MySQL",
      value: node?.type === "decision" ? node.decision.description : "",
      validateInput: (v) => (v.trim() ? undefined : "Describe the decision"),
    });
    if (description === undefined) {
      return;
    }
    await client.lockDecision(sessionId, description.trim());
    this.deps.tree.refresh();
  }

  async exportSession(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Export which session?");
    if (!sessionId) {
      return;
    }
    const formats: Picked<ExportFormat>[] = [
      { label: "Markdown", description: "to read", value: "markdown" },
      { label: "JSON", description: "everything; imports back losslessly", value: "json" },
      { label: "JSONL", description: "OpenAI chat lines", value: "jsonl" },
    ];
    const format = await vscode.window.showQuickPick(formats, { placeHolder: "Export format" });
    if (!format) {
      return;
    }
    const exported = await (await this.client()).exportSession(sessionId, format.value);
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri;
    const target = await vscode.window.showSaveDialog({
      defaultUri: folder ? vscode.Uri.joinPath(folder, exported.filename) : undefined,
      saveLabel: "Export", title: `Export ${await this.title(sessionId)}`,
    });
    if (!target) {
      return;
    }
    await vscode.workspace.fs.writeFile(target, Buffer.from(exported.document, "utf8"));
    void vscode.window.showInformationMessage(`ctxd: exported ${exported.messageCount} messages to ${target.fsPath}.`);
  }

  async deleteSession(node?: Node): Promise<void> {
    const sessionId = await this.sessionFor(node, "Delete which session?");
    if (!sessionId) {
      return;
    }
    const answer = await vscode.window.showWarningMessage(
      `Delete ${await this.title(sessionId)}?`,
      { modal: true, detail: "Its whole history, checkpoints and snapshots are deleted. This cannot be undone." }, "Delete");
    if (answer !== "Delete") {
      return;
    }
    const result = await (await this.client()).deleteSession(sessionId);
    void vscode.window.showInformationMessage(`ctxd: deleted the session and its ${result.deletedMessages} messages.`);
    this.deps.tree.refresh();
  }

  /** Search every session as you type; the chosen hit opens in context. Resolves when the pick closes. */
  search(): Promise<void> {
    const pick = vscode.window.createQuickPick<Picked<SearchHit>>();
    pick.placeholder = "Search every ctxd session (words; all must appear)";
    pick.matchOnDescription = true;
    pick.matchOnDetail = true;
    let generation = 0;
    const run = async (query: string): Promise<void> => {
      const mine = ++generation;
      if (!query.trim()) {
        pick.items = [];
        return;
      }
      pick.busy = true;
      try {
        const { hits } = await (await this.client()).search({ query, limit: 50 });
        if (mine === generation) {
          // Every hit matched the query already: keep them all (VS Code would re-filter by label).
          pick.items = hits.map((hit) => ({ ...hitLabel(hit), alwaysShow: true, value: hit }));
        }
      } catch (err) {
        if (mine === generation) {
          pick.items = [{ label: `$(error) ${err instanceof Error ? err.message : String(err)}`, alwaysShow: true, value: undefined as unknown as SearchHit }];
        }
      } finally {
        if (mine === generation) {
          pick.busy = false;
        }
      }
    };
    return new Promise<void>((resolve) => {
      let accepted = false;
      pick.onDidChangeValue((value) => void run(value));
      pick.onDidAccept(() => {
        const hit = pick.selectedItems[0]?.value;
        accepted = true;
        pick.hide();
        if (hit) {
          this.deps.documents.open({ kind: "message", sessionId: hit.sessionId, seq: hit.seq }).then(() => resolve(), (err: unknown) => {
            void vscode.window.showErrorMessage(`ctxd: ${err instanceof Error ? err.message : String(err)}`);
            resolve();
          });
        } else {
          resolve();
        }
      });
      pick.onDidHide(() => {
        pick.dispose();
        if (!accepted) {
          resolve();
        }
      });
      pick.show();
    });
  }

  async showPrompt(node?: Node): Promise<void> {
    const sessionId = nodeSessionId(node) ?? this.deps.active.sessionId ?? (await this.sessionFor(undefined, "Preview the prompt of which session?"));
    if (!sessionId) {
      return;
    }
    const preferred = this.deps.promptFormat();
    const formats: PromptFormat[] = ["openai", "anthropic", "ollama"];
    const items: Picked<PromptFormat>[] = formats
      .sort((a, b) => Number(b === preferred) - Number(a === preferred))
      .map((f) => ({ label: f, description: f === preferred ? "ctxd.promptFormat" : "", value: f }));
    const format = await vscode.window.showQuickPick(items, { placeHolder: "The provider format of the prompt preview" });
    if (format) {
      await this.deps.documents.open({ kind: "prompt", sessionId, format: format.value });
    }
  }
}
