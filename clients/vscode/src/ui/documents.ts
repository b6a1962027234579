/**
 * Read-only `ctxd:` documents: a message in its context (search hits), a checkpoint
 * expanded into its messages, and the prompt preview in a provider's format, which is
 * rendered again whenever the session changes.
 */
import * as vscode from "vscode";
import { CtxdSupervisor } from "../protocol/supervisor";
import { CtxdNotification } from "../protocol/types";
import { CtxdDocument, SCHEME, documentPath, parseDocumentPath, renderContext, renderExpanded, renderPrompt } from "./model";

export const CONTEXT_RADIUS = 3;

export class CtxdDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.changed.event;
  private readonly prompts = new Map<string, vscode.Uri>();
  private readonly disposables: { dispose(): void }[] = [];

  constructor(private readonly supervisor: CtxdSupervisor) {
    this.disposables.push(
      supervisor.onNotification((n) => this.onNotification(n)),
      vscode.workspace.onDidCloseTextDocument((d) => this.prompts.delete(d.uri.toString())),
    );
  }

  static uri(doc: CtxdDocument): vscode.Uri {
    return vscode.Uri.from({ scheme: SCHEME, path: documentPath(doc) });
  }

  private onNotification(n: CtxdNotification): void {
    if (n.method !== "session/updated" && n.method !== "context/compressed" && n.method !== "snapshot/restored") {
      return;
    }
    for (const uri of this.prompts.values()) {
      const doc = parseDocumentPath(uri.path);
      if (doc?.sessionId === n.params.sessionId) {
        this.changed.fire(uri);
      }
    }
  }

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const doc = parseDocumentPath(uri.path);
    if (!doc) {
      return `Not a ctxd document: ${uri.toString()}`;
    }
    const client = await this.supervisor.ready();
    switch (doc.kind) {
      case "message": {
        const session = await client.getSession(doc.sessionId);
        const from = Math.max(1, doc.seq - CONTEXT_RADIUS);
        const page = await client.history(doc.sessionId, from, 2 * CONTEXT_RADIUS + 1);
        return renderContext(session, page.messages, doc.seq);
      }
      case "checkpoint": {
        const session = await client.getSession(doc.sessionId);
        return renderExpanded(session, await client.expandCheckpoint(doc.sessionId, doc.checkpointId));
      }
      case "prompt":
        this.prompts.set(uri.toString(), uri);
        // A look, not a request: the session's bill and calibration stay as they are.
        return renderPrompt(await client.prompt(doc.sessionId, doc.format, { preview: true }));
    }
  }

  /** Open (or reveal) a document. */
  async open(doc: CtxdDocument): Promise<vscode.TextEditor> {
    const document = await vscode.workspace.openTextDocument(CtxdDocuments.uri(doc));
    return vscode.window.showTextDocument(document, { preview: doc.kind !== "prompt" });
  }

  dispose(): void {
    for (const d of this.disposables) {
      d.dispose();
    }
    this.changed.dispose();
  }
}
