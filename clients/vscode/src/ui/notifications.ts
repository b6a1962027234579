/** ctxd's notifications as VS Code messages, as the `ctxd.notify.*` settings say. */
import * as vscode from "vscode";
import { CtxdSupervisor } from "../protocol/supervisor";
import { CtxdNotification } from "../protocol/types";
import { NotifyPrefs, describeNotification } from "./model";

export function notifyPrefs(config: vscode.WorkspaceConfiguration): NotifyPrefs {
  return {
    compression: config.get<boolean>("notify.compression", false),
    overflow: config.get<boolean>("notify.overflow", true),
    reliability: config.get<boolean>("notify.reliability", true),
    threshold: config.get<boolean>("notify.threshold", false),
  };
}

export function showNotification(n: CtxdNotification, prefs: NotifyPrefs, title: string): Thenable<string | undefined> | undefined {
  const message = describeNotification(n, prefs, title);
  if (!message) {
    return undefined;
  }
  switch (message.severity) {
    case "error":
      return vscode.window.showErrorMessage(message.text);
    case "warning":
      return vscode.window.showWarningMessage(message.text);
    default:
      return vscode.window.showInformationMessage(message.text);
  }
}

export function watchNotifications(supervisor: CtxdSupervisor, titleOf: (sessionId: string) => string): vscode.Disposable {
  const sub = supervisor.onNotification((n) => {
    void showNotification(n, notifyPrefs(vscode.workspace.getConfiguration("ctxd")), titleOf(n.params.sessionId));
  });
  return new vscode.Disposable(() => sub.dispose());
}
