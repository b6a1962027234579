/** The ctxd view: sessions; under each its goal, checkpoints and snapshots. */
import * as vscode from "vscode";
import { CtxdSupervisor } from "../protocol/supervisor";
import { Checkpoint, CtxdNotification, Decision, Goal, SessionInfo, SnapshotInfo } from "../protocol/types";
import { ActiveSession } from "./active";
import { checkpointLabel, formatTokens, sessionDescription, sessionLabel, snapshotLabel } from "./model";

export type Node =
  | { type: "session"; session: SessionInfo }
  | { type: "goal"; sessionId: string; goal: Goal | null; tokens: number }
  | { type: "decision"; sessionId: string; decision: Decision }
  | { type: "group"; sessionId: string; group: "checkpoints" | "snapshots" }
  | { type: "checkpoint"; sessionId: string; checkpoint: Checkpoint }
  | { type: "snapshot"; sessionId: string; snapshot: SnapshotInfo }
  | { type: "info"; text: string };

/** The session a node belongs to (commands take any node). */
export function nodeSessionId(node: Node | undefined): string | undefined {
  if (!node || node.type === "info") {
    return undefined;
  }
  return node.type === "session" ? node.session.sessionId : node.sessionId;
}

export class SessionsTree implements vscode.TreeDataProvider<Node>, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  /** Titles of the sessions last listed, for messages that name a session. */
  readonly titles = new Map<string, string>();
  private readonly disposables: { dispose(): void }[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly supervisor: CtxdSupervisor, private readonly active: ActiveSession,
              private readonly limit: () => number) {
    this.disposables.push(
      supervisor.onState(() => this.refresh()),
      supervisor.onNotification((n) => this.onNotification(n)),
      active.onDidChange(() => this.refresh()),
    );
  }

  private onNotification(n: CtxdNotification): void {
    if (n.method === "context/compressing" || n.method === "context/threshold" || n.method === "context/reliability") {
      return;
    }
    // An agent pushing fast would redraw the view on every message: once per half second is enough.
    if (!this.timer) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.refresh();
      }, 500);
    }
  }

  refresh(): void {
    this.changed.fire(undefined);
  }

  titleOf(sessionId: string): string {
    return this.titles.get(sessionId) ?? sessionId;
  }

  getTreeItem(node: Node): vscode.TreeItem {
    const C = vscode.TreeItemCollapsibleState;
    switch (node.type) {
      case "session": {
        const s = node.session;
        const item = new vscode.TreeItem(sessionLabel(s), C.Collapsed);
        const isActive = s.sessionId === this.active.sessionId;
        item.id = `session:${s.sessionId}`;
        item.description = `${sessionDescription(s)}${isActive ? " · active" : ""}`;
        item.tooltip = `${s.sessionId}\n${s.model ?? "no model"}, window ${s.contextWindow}\nlast activity ${s.lastActivity}`;
        item.iconPath = new vscode.ThemeIcon(isActive ? "comment-discussion" : "comment");
        item.contextValue = "session";
        return item;
      }
      case "goal": {
        const goal = node.goal;
        const item = new vscode.TreeItem(goal ? `Goal: ${goal.description}` : "No goal",
          goal?.decisions?.length ? C.Collapsed : C.None);
        item.id = `goal:${node.sessionId}`;
        item.description = goal ? `${goal.status ?? "active"} · ${formatTokens(node.tokens)} tok` : "set one with \"Set Goal\"";
        item.iconPath = new vscode.ThemeIcon("target");
        item.contextValue = goal ? "goal" : "noGoal";
        return item;
      }
      case "decision": {
        const item = new vscode.TreeItem(node.decision.description, C.None);
        item.description = node.decision.locked ? "locked" : "";
        item.iconPath = new vscode.ThemeIcon(node.decision.locked ? "lock" : "unlock");
        item.contextValue = "decision";
        return item;
      }
      case "group": {
        const item = new vscode.TreeItem(node.group === "checkpoints" ? "Checkpoints" : "Snapshots", C.Collapsed);
        item.id = `${node.group}:${node.sessionId}`;
        item.iconPath = new vscode.ThemeIcon(node.group === "checkpoints" ? "fold" : "history");
        item.contextValue = node.group;
        return item;
      }
      case "checkpoint": {
        const { label, description } = checkpointLabel(node.checkpoint);
        const item = new vscode.TreeItem(label, C.None);
        item.id = `checkpoint:${node.sessionId}:${node.checkpoint.id}`;
        item.description = description;
        item.tooltip = new vscode.MarkdownString(node.checkpoint.summary);
        item.iconPath = new vscode.ThemeIcon("note");
        item.contextValue = "checkpoint";
        item.command = { command: "ctxd.expandCheckpoint", title: "Expand", arguments: [node] };
        return item;
      }
      case "snapshot": {
        const { label, description } = snapshotLabel(node.snapshot);
        const item = new vscode.TreeItem(label, C.None);
        item.id = `snapshot:${node.sessionId}:${node.snapshot.snapshotId}`;
        item.description = description;
        item.tooltip = `${node.snapshot.snapshotId}\n${node.snapshot.messageCount} messages, ${node.snapshot.checkpointCount} checkpoints`;
        item.iconPath = new vscode.ThemeIcon("device-camera");
        item.contextValue = "snapshot";
        return item;
      }
      case "info":
        return new vscode.TreeItem(node.text, C.None);
    }
  }

  async getChildren(node?: Node): Promise<Node[]> {
    const client = this.supervisor.client;
    if (!client || this.supervisor.state.kind !== "connected") {
      const state = this.supervisor.state;
      return [{ type: "info", text: state.kind === "failed" ? `ctxd is not running: ${state.error.problem}` : "Connecting to ctxd…" }];
    }
    try {
      if (!node) {
        const { sessions } = await client.listSessions(this.limit());
        for (const s of sessions) {
          this.titles.set(s.sessionId, sessionLabel(s));
        }
        return sessions.length ? sessions.map((session) => ({ type: "session", session })) : [{ type: "info", text: "No sessions yet." }];
      }
      switch (node.type) {
        case "session": {
          const sessionId = node.session.sessionId;
          const goal = await client.getGoal(sessionId);
          return [
            { type: "goal", sessionId, goal: goal.goal, tokens: goal.tokens },
            { type: "group", sessionId, group: "checkpoints" },
            { type: "group", sessionId, group: "snapshots" },
          ];
        }
        case "goal":
          return (node.goal?.decisions ?? []).map((decision) => ({ type: "decision", sessionId: node.sessionId, decision }));
        case "group": {
          if (node.group === "checkpoints") {
            const { checkpoints } = await client.checkpoints(node.sessionId);
            return checkpoints.length
              ? checkpoints.map((checkpoint) => ({ type: "checkpoint", sessionId: node.sessionId, checkpoint }))
              : [{ type: "info", text: "None yet (nothing compressed)." }];
          }
          const { snapshots } = await client.listSnapshots(node.sessionId);
          return snapshots.length
            ? snapshots.map((snapshot) => ({ type: "snapshot", sessionId: node.sessionId, snapshot }))
            : [{ type: "info", text: "None yet." }];
        }
        default:
          return [];
      }
    } catch (err) {
      return [{ type: "info", text: `ctxd: ${err instanceof Error ? err.message : String(err)}` }];
    }
  }

  dispose(): void {
    if (this.timer) {
      clearTimeout(this.timer);
    }
    for (const d of this.disposables) {
      d.dispose();
    }
    this.changed.dispose();
  }
}
