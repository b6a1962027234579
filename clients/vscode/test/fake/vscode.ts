/**
 * A small stand-in for the `vscode` module: the API surface the extension uses, with
 * every dialog answered from a script and every message, progress report and document
 * recorded. VS Code itself cannot run here; the UI modules run against this.
 */
import * as fs from "fs";
import * as path from "path";

type Listener<T> = (e: T) => unknown;

export class Disposable {
  constructor(private readonly fn: () => unknown) {}
  static from(...items: { dispose(): unknown }[]): Disposable {
    return new Disposable(() => items.forEach((i) => i.dispose()));
  }
  dispose(): void {
    this.fn();
  }
}

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  readonly event = (listener: Listener<T>): Disposable => {
    this.listeners.push(listener);
    return new Disposable(() => {
      this.listeners = this.listeners.filter((l) => l !== listener);
    });
  };
  fire(e: T): void {
    for (const l of [...this.listeners]) {
      l(e);
    }
  }
  dispose(): void {
    this.listeners = [];
  }
}

export enum StatusBarAlignment { Left = 1, Right = 2 }
export enum TreeItemCollapsibleState { None = 0, Collapsed = 1, Expanded = 2 }
export enum ProgressLocation { SourceControl = 1, Window = 10, Notification = 15 }

export class ThemeColor {
  constructor(readonly id: string) {}
}
export class ThemeIcon {
  constructor(readonly id: string) {}
}
export class MarkdownString {
  constructor(readonly value = "") {}
}

export class TreeItem {
  id?: string;
  description?: string;
  tooltip?: string | MarkdownString;
  iconPath?: ThemeIcon;
  contextValue?: string;
  command?: { command: string; title: string; arguments?: unknown[] };
  constructor(readonly label: string, readonly collapsibleState: TreeItemCollapsibleState = TreeItemCollapsibleState.None) {}
}

export class Uri {
  private constructor(readonly scheme: string, readonly path: string) {}
  static from(parts: { scheme: string; path: string }): Uri {
    return new Uri(parts.scheme, parts.path);
  }
  static file(p: string): Uri {
    return new Uri("file", p);
  }
  static joinPath(base: Uri, ...segments: string[]): Uri {
    return new Uri(base.scheme, path.posix.join(base.path, ...segments));
  }
  get fsPath(): string {
    return this.path;
  }
  toString(): string {
    return `${this.scheme}:${this.path}`;
  }
}

// --- the script: answers to dialogs, and what was shown ------------------------------------

export interface Call {
  kind: string;
  args: unknown[];
}

/** Answers handed out in order to showQuickPick/showInputBox/show*Message/showSaveDialog. */
export const ui = {
  calls: [] as Call[],
  answers: [] as ((kind: string, ...args: unknown[]) => unknown)[],
  settings: new Map<string, unknown>(),
  reset(): void {
    this.calls = [];
    this.answers = [];
  },
  called(kind: string): Call[] {
    return this.calls.filter((c) => c.kind === kind);
  },
};

function answer(kind: string, ...args: unknown[]): Promise<unknown> {
  ui.calls.push({ kind, args });
  const next = ui.answers.shift();
  return Promise.resolve(next ? next(kind, ...args) : undefined);
}

export class FakeStatusBarItem {
  text = "";
  tooltip: string | undefined;
  backgroundColor: ThemeColor | undefined;
  command: string | undefined;
  name: string | undefined;
  visible = false;
  constructor(readonly id: string, readonly alignment: StatusBarAlignment, readonly priority: number) {}
  show(): void {
    this.visible = true;
  }
  hide(): void {
    this.visible = false;
  }
  dispose(): void {
    this.visible = false;
  }
}

export class FakeQuickPick<T> {
  items: T[] = [];
  selectedItems: T[] = [];
  value = "";
  placeholder = "";
  private busyValue = false;
  /** Fires when the pick stops being busy (a search answered). */
  readonly idle = new EventEmitter<void>();
  get busy(): boolean {
    return this.busyValue;
  }
  set busy(value: boolean) {
    this.busyValue = value;
    if (!value) {
      this.idle.fire();
    }
  }
  matchOnDescription = false;
  matchOnDetail = false;
  readonly changeValue = new EventEmitter<string>();
  readonly accept = new EventEmitter<void>();
  readonly hidden = new EventEmitter<void>();
  readonly onDidChangeValue = this.changeValue.event;
  readonly onDidAccept = this.accept.event;
  readonly onDidHide = this.hidden.event;
  shown = false;
  show(): void {
    this.shown = true;
    ui.calls.push({ kind: "createQuickPick.show", args: [this] });
  }
  hide(): void {
    this.shown = false;
    this.hidden.fire();
  }
  dispose(): void {
    this.shown = false;
  }
  /** What typing does. */
  type(value: string): void {
    this.value = value;
    this.changeValue.fire(value);
  }
}

export interface FakeDocument {
  uri: Uri;
  getText(): string;
}

export interface ContentProvider {
  onDidChange?: unknown;
  provideTextDocumentContent(uri: Uri): string | Promise<string>;
}

const providers = new Map<string, ContentProvider>();
const statusItems: FakeStatusBarItem[] = [];
const registered = new Map<string, (...args: unknown[]) => unknown>();
const configChanged = new EventEmitter<{ affectsConfiguration(key: string): boolean }>();
const closed = new EventEmitter<FakeDocument>();

export const fake = {
  statusItems,
  registered,
  providers,
  configChanged,
  closed,
  /** Lines written to output channels. */
  output: [] as string[],
};

export const window = {
  createStatusBarItem(id: string, alignment: StatusBarAlignment, priority: number): FakeStatusBarItem {
    const item = new FakeStatusBarItem(id, alignment, priority);
    statusItems.push(item);
    return item;
  },
  showInformationMessage: (...args: unknown[]) => answer("showInformationMessage", ...args),
  showWarningMessage: (...args: unknown[]) => answer("showWarningMessage", ...args),
  showErrorMessage: (...args: unknown[]) => answer("showErrorMessage", ...args),
  showQuickPick: async (items: unknown, options?: unknown) => answer("showQuickPick", await items, options),
  showInputBox: (options?: unknown) => answer("showInputBox", options),
  showSaveDialog: (options?: unknown) => answer("showSaveDialog", options),
  showTextDocument: (doc: FakeDocument, options?: unknown) => {
    ui.calls.push({ kind: "showTextDocument", args: [doc, options] });
    return Promise.resolve({ document: doc });
  },
  async withProgress<R>(options: unknown, task: (progress: { report(v: unknown): void }) => Promise<R>): Promise<R> {
    const reports: unknown[] = [];
    ui.calls.push({ kind: "withProgress", args: [options, reports] });
    return task({ report: (v) => reports.push(v) });
  },
  createQuickPick<T>(): FakeQuickPick<T> {
    return new FakeQuickPick<T>();
  },
  createOutputChannel(name: string) {
    return {
      name,
      appendLine: (line: string) => fake.output.push(line),
      show: () => ui.calls.push({ kind: "output.show", args: [] }),
      dispose: () => undefined,
    };
  },
  createTreeView(id: string, options: unknown) {
    ui.calls.push({ kind: "createTreeView", args: [id, options] });
    return { dispose: () => undefined };
  },
};

export const workspace = {
  workspaceFolders: undefined as { uri: Uri }[] | undefined,
  getConfiguration(section: string) {
    return {
      get<T>(key: string, fallback?: T): T | undefined {
        const full = `${section}.${key}`;
        return ui.settings.has(full) ? (ui.settings.get(full) as T) : fallback;
      },
    };
  },
  onDidChangeConfiguration: configChanged.event,
  onDidCloseTextDocument: closed.event,
  registerTextDocumentContentProvider(scheme: string, provider: ContentProvider): Disposable {
    providers.set(scheme, provider);
    return new Disposable(() => providers.delete(scheme));
  },
  async openTextDocument(uri: Uri): Promise<FakeDocument> {
    const provider = providers.get(uri.scheme);
    if (!provider) {
      throw new Error(`no provider for ${uri.scheme}`);
    }
    const text = await provider.provideTextDocumentContent(uri);
    return { uri, getText: () => text };
  },
  fs: {
    writeFile: (uri: Uri, content: Uint8Array) => fs.promises.writeFile(uri.fsPath, content),
  },
};

export const commands = {
  registerCommand(id: string, fn: (...args: unknown[]) => unknown): Disposable {
    registered.set(id, fn);
    return new Disposable(() => registered.delete(id));
  },
  executeCommand(id: string, ...args: unknown[]): Promise<unknown> {
    const fn = registered.get(id);
    if (!fn) {
      ui.calls.push({ kind: "executeCommand", args: [id, ...args] });
      return Promise.resolve(undefined);
    }
    return Promise.resolve(fn(...args));
  },
};
