/**
 * The ctxd extension: one connection to the shared daemon through the forwarder
 * (`ctxd --remote auto`), a status bar item, the ctxd view, commands, read-only
 * documents, and `exports` for other extensions (src/api.ts).
 */
import * as vscode from "vscode";
import { CtxdApi, createApi } from "./api";
import { CtxdStartError, ServerCommand } from "./protocol/client";
import { locateCtxd } from "./protocol/locate";
import { CtxdSupervisor } from "./protocol/supervisor";
import { PromptFormat } from "./protocol/types";
import { ActiveSession } from "./ui/active";
import { Commands } from "./ui/commands";
import { CtxdDocuments } from "./ui/documents";
import { SCHEME } from "./ui/model";
import { watchNotifications } from "./ui/notifications";
import { StatusBar } from "./ui/statusBar";
import { SessionsTree } from "./ui/tree";

export const DEFAULT_ARGS = ["--remote", "auto"];

/** The command to run, from the settings (or why there is none). */
export function serverCommand(config: vscode.WorkspaceConfiguration): ServerCommand | CtxdStartError {
  const located = locateCtxd({
    configuredPath: config.get<string>("path", ""),
    venv: config.get<string>("venv", ""),
    baseDir: vscode.workspace.workspaceFolders?.[0]?.uri.fsPath,
  });
  if (!located.ok) {
    return new CtxdStartError("notFound", located.problem, located.fix);
  }
  const extraEnv = config.get<Record<string, string>>("env", {});
  return { command: located.command, args: config.get<string[]>("args", DEFAULT_ARGS), env: { ...process.env, ...extraEnv } };
}

let supervisor: CtxdSupervisor | undefined;

export function activate(context: vscode.ExtensionContext): CtxdApi {
  const output = vscode.window.createOutputChannel("ctxd");
  const version = (context.extension?.packageJSON as { version?: string } | undefined)?.version;
  const sup = new CtxdSupervisor({
    resolveCommand: () => {
      const command = serverCommand(vscode.workspace.getConfiguration("ctxd"));
      if (!(command instanceof CtxdStartError)) {
        output.appendLine(`starting ${[command.command, ...command.args].join(" ")}`);
      }
      return command;
    },
    clientName: "ctxd-vscode",
    clientVersion: version,
    log: (line) => output.appendLine(line),
  });
  supervisor = sup;
  const active = new ActiveSession();
  const tree = new SessionsTree(sup, active, () => vscode.workspace.getConfiguration("ctxd").get<number>("sessionLimit", 50));
  const documents = new CtxdDocuments(sup);
  const status = new StatusBar(sup, active);
  const commands = new Commands({
    supervisor: sup, active, tree, documents, output,
    promptFormat: () => vscode.workspace.getConfiguration("ctxd").get<PromptFormat>("promptFormat", "openai"),
  });

  let shownFailure: CtxdStartError | undefined;
  const stateSub = sup.onState((state) => {
    switch (state.kind) {
      case "connected": {
        const info = state.client.initializeResult?.serverInfo;
        output.appendLine(`connected to ${info?.name ?? "ctxd"} ${info?.version ?? ""} (pid ${state.client.pid ?? "?"})`);
        shownFailure = undefined;
        break;
      }
      case "disconnected":
        output.appendLine(`${state.reason}; reconnecting in ${state.retryInMs} ms`);
        break;
      case "failed":
        output.appendLine(`${state.error.problem} ${state.error.fix}`);
        if (shownFailure?.message !== state.error.message) {
          shownFailure = state.error;
          void vscode.commands.executeCommand("ctxd.showSetupHelp");
        }
        break;
      default:
        break;
    }
  });
  const activeSub = sup.onNotification((n) => active.observe(n));

  context.subscriptions.push(
    output, tree, documents, status, active,
    vscode.window.createTreeView("ctxd.sessions", { treeDataProvider: tree, showCollapseAll: true }),
    vscode.workspace.registerTextDocumentContentProvider(SCHEME, documents),
    ...commands.register(),
    watchNotifications(sup, (id) => tree.titleOf(id)),
    new vscode.Disposable(() => {
      stateSub.dispose();
      activeSub.dispose();
    }),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (["ctxd.path", "ctxd.venv", "ctxd.args", "ctxd.env"].some((key) => e.affectsConfiguration(key))) {
        void sup.restart();
      }
      if (e.affectsConfiguration("ctxd.sessionLimit")) {
        tree.refresh();
      }
    }),
  );
  sup.start();
  return createApi(sup);
}

export async function deactivate(): Promise<void> {
  const sup = supervisor;
  supervisor = undefined;
  if (sup) {
    await sup.stop();
    sup.dispose();
  }
}
