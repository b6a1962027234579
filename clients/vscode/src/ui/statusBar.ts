/** The status bar item: the active session's prompt against maxPromptTokens, live. */
import * as vscode from "vscode";
import { CtxdSupervisor } from "../protocol/supervisor";
import { Budget, CtxdNotification, SessionBill, SessionInfo } from "../protocol/types";
import { ActiveSession } from "./active";
import { StatusInput, StatusLevel, statusView } from "./model";

export function statusColor(level: StatusLevel): vscode.ThemeColor | undefined {
  switch (level) {
    case "trigger":
      return new vscode.ThemeColor("statusBarItem.warningBackground");
    case "overflow":
      return new vscode.ThemeColor("statusBarItem.errorBackground");
    default:
      return undefined;
  }
}

export class StatusBar implements vscode.Disposable {
  readonly item: vscode.StatusBarItem;
  private session: Pick<SessionInfo, "sessionId" | "title"> | undefined;
  private budget: Budget | undefined;
  private bill: SessionBill | null | undefined;
  private overflowed = false;
  private compressing: { stage: string; percentage: number } | undefined;
  private dirty = false;
  private running: Promise<void> | undefined;
  private readonly disposables: { dispose(): void }[] = [];

  constructor(private readonly supervisor: CtxdSupervisor, private readonly active: ActiveSession) {
    this.item = vscode.window.createStatusBarItem("ctxd.status", vscode.StatusBarAlignment.Right, 100);
    this.item.name = "ctxd";
    this.disposables.push(
      supervisor.onState((s) => {
        if (s.kind === "connected") {
          void this.refresh();
        } else {
          this.render();
        }
      }),
      supervisor.onNotification((n) => this.onNotification(n)),
      active.onDidChange(() => {
        this.budget = undefined;
        this.overflowed = false;
        this.compressing = undefined;
        void this.refresh();
      }),
    );
    this.render();
    this.item.show();
  }

  private onNotification(n: CtxdNotification): void {
    if (n.params.sessionId !== this.active.sessionId) {
      return;
    }
    switch (n.method) {
      case "context/compressing":
        this.compressing = { stage: n.params.stage, percentage: n.params.percentage };
        this.render();
        return;
      case "context/compressed":
      case "context/compressionFailed":
        this.compressing = undefined;
        this.overflowed = false;
        break;
      case "context/overflow":
        this.overflowed = true;
        if (this.budget) {
          this.budget = { ...this.budget, promptTokens: n.params.promptTokens, maxPromptTokens: n.params.maxPromptTokens };
        }
        this.render();
        break;
      case "session/updated":
      case "snapshot/restored":
      case "checkpoint/aged":
      case "checkpoint/merged":
        break;
      default:
        return;
    }
    void this.refresh();
  }

  /** Reload the active session's budget; calls during a reload coalesce into one more. */
  refresh(): Promise<void> {
    this.dirty = true;
    if (!this.running) {
      this.running = this.loop().finally(() => {
        this.running = undefined;
      });
    }
    return this.running;
  }

  private async loop(): Promise<void> {
    while (this.dirty) {
      this.dirty = false;
      await this.load();
    }
    this.render();
  }

  private async load(): Promise<void> {
    const client = this.supervisor.client;
    if (!client || this.supervisor.state.kind !== "connected") {
      return;
    }
    try {
      if (this.active.sessionId === undefined) {
        const { sessions } = await client.listSessions(1);
        this.active.offer(sessions[0]?.sessionId);
        this.dirty = false; // offer() asked for a refresh; this one does it
      }
      const id = this.active.sessionId;
      if (id === undefined) {
        this.session = undefined;
        this.budget = undefined;
        return;
      }
      const [info, stats] = await Promise.all([client.getSession(id), client.stats(id)]);
      if (id !== this.active.sessionId) {
        return;
      }
      this.session = info;
      this.budget = stats.budget;
      this.bill = stats.bill;
      if (stats.budget.promptTokens <= stats.budget.maxPromptTokens) {
        this.overflowed = false;
      }
    } catch {
      // The session went away or the connection dropped: the next event refreshes again.
      this.budget = undefined;
    }
  }

  /** What the item shows now (also what the tests check). */
  view(): ReturnType<typeof statusView> {
    const state = this.supervisor.state;
    const input: StatusInput = {
      connection: state.kind,
      problem: state.kind === "failed" ? state.error.problem : state.kind === "disconnected" ? state.reason : undefined,
      session: this.session && this.session.sessionId === this.active.sessionId ? this.session : undefined,
      budget: this.budget,
      overflowed: this.overflowed,
      compressing: this.compressing,
      bill: this.bill,
    };
    return statusView(input);
  }

  render(): void {
    const view = this.view();
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = statusColor(view.level);
    this.item.command = this.supervisor.state.kind === "failed" ? "ctxd.showSetupHelp" : "ctxd.pickSession";
  }

  dispose(): void {
    for (const d of this.disposables) {
      d.dispose();
    }
    this.item.dispose();
  }
}
