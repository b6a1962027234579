/**
 * One connection to ctxd over the stdio of a child process: normally the forwarder
 * `ctxd --remote auto`, which relays the frames to the shared daemon's socket; in tests
 * a `ctxd --stdio` daemon of its own. Plain TypeScript over vscode-jsonrpc: no `vscode`.
 */
import { ChildProcess, spawn } from "child_process";
import {
  Disposable, Emitter, Event, MessageConnection, ProgressType, ResponseError,
  StreamMessageReader, StreamMessageWriter, createMessageConnection,
} from "vscode-jsonrpc/node";
import { INSTALL_FIX } from "./locate";
import {
  CheckpointsResult, CompressResult, ContextStatsResult, CtxdNotification, DaemonStatusResult, Decision,
  ExpandResult, ExportFormat, ExportResult, GoalResult, HistoryResult, InitializeResult, Message,
  NOTIFICATION_METHODS, NotificationMap, NotificationMethod, PinResult, Prompt, PromptFormat, PushResult, SearchParams,
  SearchResult, SessionCreateParams, SessionDeleteResult, SessionInfo, SessionListResult, SnapshotInfo,
  SnapshotListResult, SnapshotRestoreResult, WorkDoneProgress,
} from "./types";

export interface ServerCommand {
  command: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

export type StartProblem = "notFound" | "noForwarder" | "exited";

/** ctxd could not be started; `fix` says what the user should do. */
export class CtxdStartError extends Error {
  constructor(readonly kind: StartProblem, readonly problem: string, readonly fix: string) {
    super(`${problem} ${fix}`);
    this.name = "CtxdStartError";
  }
}

/** ctxd answered a request with an error (codes in protocol/methods.md). */
export class CtxdRequestError extends Error {
  constructor(readonly method: string, readonly code: number, message: string, readonly data?: unknown) {
    super(message);
    this.name = "CtxdRequestError";
  }
}

export interface ClientOptions {
  clientName?: string;
  clientVersion?: string;
  /** Lines ctxd writes to stderr (its log). */
  log?: (line: string) => void;
  /** How long `close()` waits for the child to exit before killing it. */
  closeGraceMs?: number;
}

const progressType = new ProgressType<WorkDoneProgress>();
let tokens = 0;

export class CtxdClient implements Disposable {
  private readonly notificationEmitter = new Emitter<CtxdNotification>();
  private readonly exitEmitter = new Emitter<{ code: number | null; signal: NodeJS.Signals | null; expected: boolean }>();
  private closing = false;
  private exited = false;
  private readonly stderrTail: string[] = [];
  initializeResult: InitializeResult | undefined;

  /** Every session notification of the sessions this connection subscribed to. */
  readonly onNotification: Event<CtxdNotification> = this.notificationEmitter.event;
  /** The child exited (`expected` when `close()` asked it to). */
  readonly onExit = this.exitEmitter.event;

  private constructor(readonly child: ChildProcess, private readonly connection: MessageConnection,
                      private readonly options: ClientOptions) {
    const known = new Set<string>(NOTIFICATION_METHODS);
    connection.onNotification((method: string, params: unknown) => {
      if (known.has(method)) {
        this.notificationEmitter.fire({ method, params } as CtxdNotification);
      }
    });
    connection.listen();
  }

  /** Spawn `server` and initialize the connection. */
  static async start(server: ServerCommand, options: ClientOptions = {}): Promise<CtxdClient> {
    const child = spawn(server.command, server.args, {
      cwd: server.cwd, env: server.env ?? process.env, stdio: ["pipe", "pipe", "pipe"], windowsHide: true,
    });
    const spawned = new Promise<void>((resolve, reject) => {
      child.once("spawn", () => resolve());
      child.once("error", (err: NodeJS.ErrnoException) => {
        if (err.code === "ENOENT" || err.code === "EACCES") {
          reject(new CtxdStartError("notFound", `Cannot run ${server.command} (${err.code}).`, INSTALL_FIX));
        } else {
          reject(new CtxdStartError("exited", `Cannot run ${server.command}: ${err.message}.`, INSTALL_FIX));
        }
      });
    });
    await spawned;
    const stdout = child.stdout;
    const stdin = child.stdin;
    if (!stdout || !stdin) {
      throw new CtxdStartError("exited", "ctxd was started without pipes.", INSTALL_FIX);
    }
    const connection = createMessageConnection(new StreamMessageReader(stdout), new StreamMessageWriter(stdin));
    const client = new CtxdClient(child, connection, options);
    // "close" (not "exit"): by then its stderr has been read, so the reason can quote it.
    const exited = new Promise<never>((_, reject) => {
      child.once("close", (code: number | null, signal: NodeJS.Signals | null) => {
        reject(client.startFailure(server, code, signal));
      });
    });
    exited.catch(() => undefined);
    try {
      await Promise.race([client.initialize(), exited]);
    } catch (err) {
      let reason: unknown = err;
      // A request that failed because the child died (its connection is disposed on exit,
      // which rejects what is pending) is reported as why it died, with its stderr.
      if (!(err instanceof CtxdStartError) && (client.exited || !(err instanceof CtxdRequestError))) {
        reason = await Promise.race([exited.catch((e: unknown) => e), new Promise((r) => setTimeout(() => r(err), 2000))]);
      }
      client.dispose();
      throw reason;
    }
    return client;
  }

  private startFailure(server: ServerCommand, code: number | null, signal: NodeJS.Signals | null): CtxdStartError {
    const stderr = this.stderrTail.join("\n");
    const command = [server.command, ...server.args].join(" ");
    if (/unrecognized arguments: .*--remote/.test(stderr)) {
      return new CtxdStartError("noForwarder", `${server.command} does not know --remote (an older ctxd).`,
        "Update ctxd (pip install the current checkout into its venv), or set ctxd.args to [] to run a private " +
        "ctxd over stdio instead of the shared daemon.");
    }
    const last = this.stderrTail.filter((l) => l.trim()).slice(-1)[0] ?? "";
    const how = signal ? `signal ${signal}` : `code ${code}`;
    return new CtxdStartError("exited", `\`${command}\` exited (${how}) before answering${last ? `: ${last}` : "."}`,
      "See the \"ctxd\" output channel for its log; check ctxd.args and `ctxd-cli doctor`.");
  }

  private wireProcess(): void {
    this.child.stderr?.setEncoding("utf8");
    let partial = "";
    this.child.stderr?.on("data", (chunk: string) => {
      const lines = (partial + chunk).split("\n");
      partial = lines.pop() ?? "";
      for (const line of lines) {
        this.stderrTail.push(line);
        if (this.stderrTail.length > 50) {
          this.stderrTail.shift();
        }
        this.options.log?.(line);
      }
    });
    this.child.once("exit", (code, signal) => {
      this.exited = true;
      this.connection.dispose();
      this.exitEmitter.fire({ code, signal, expected: this.closing });
    });
    // A write to a child that died is reported by its exit, not as an unhandled error.
    this.child.stdin?.on("error", () => undefined);
  }

  private async initialize(): Promise<InitializeResult> {
    this.wireProcess();
    const result = await this.request<InitializeResult>("initialize", {
      processId: process.pid,
      clientInfo: { name: this.options.clientName ?? "ctxd-vscode", version: this.options.clientVersion ?? null },
    });
    await this.connection.sendNotification("initialized", {});
    this.initializeResult = result;
    return result;
  }

  get isRunning(): boolean {
    return !this.exited && !this.closing;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Any request by name; typed helpers below. Errors become CtxdRequestError. */
  async request<R>(method: string, params?: object): Promise<R> {
    try {
      return params === undefined
        ? await this.connection.sendRequest<R>(method)
        : await this.connection.sendRequest<R>(method, params);
    } catch (err) {
      if (err instanceof ResponseError) {
        throw new CtxdRequestError(method, err.code, err.message, err.data);
      }
      throw err;
    }
  }

  notify(method: string, params?: object): Promise<void> {
    return params === undefined ? this.connection.sendNotification(method) : this.connection.sendNotification(method, params);
  }

  /** Notifications of one method, typed. */
  on<M extends NotificationMethod>(method: M, listener: (params: NotificationMap[M]) => void): Disposable {
    return this.onNotification((n) => {
      if (n.method === method) {
        listener(n.params as NotificationMap[M]);
      }
    });
  }

  // --- sessions -------------------------------------------------------------------------

  createSession(params: SessionCreateParams = {}): Promise<SessionInfo> {
    return this.request("session/create", params);
  }
  listSessions(limit?: number): Promise<SessionListResult> {
    return this.request("session/list", limit === undefined ? {} : { limit });
  }
  getSession(sessionId: string): Promise<SessionInfo> {
    return this.request("session/get", { sessionId });
  }
  push(sessionId: string, messages: Message[]): Promise<PushResult> {
    return this.request("session/push", { sessionId, messages });
  }
  deleteSession(sessionId: string): Promise<SessionDeleteResult> {
    return this.request("session/delete", { sessionId });
  }
  exportSession(sessionId: string, format: ExportFormat): Promise<ExportResult> {
    return this.request("session/export", { sessionId, format });
  }
  history(sessionId: string, from?: number, limit?: number): Promise<HistoryResult> {
    return this.request("session/history", { sessionId, ...(from === undefined ? {} : { from }), ...(limit === undefined ? {} : { limit }) });
  }
  search(params: SearchParams): Promise<SearchResult> {
    return this.request("session/search", params);
  }
  subscribe(sessionId: string): Promise<{ subscriptions: string[] }> {
    return this.request("session/subscribe", { sessionId });
  }
  unsubscribe(sessionId: string): Promise<{ subscriptions: string[] }> {
    return this.request("session/unsubscribe", { sessionId });
  }

  // --- context ----------------------------------------------------------------------------

  /**
   * The prompt to send next. `preview`: only to show it (ctxd does not bill it, count it
   * as handed out or pair the next reply's usage with it).
   */
  prompt(sessionId: string, format: PromptFormat = "openai", options: { preview?: boolean } = {}): Promise<Prompt> {
    return this.request("context/prompt", options.preview ? { sessionId, format, preview: true } : { sessionId, format });
  }
  /** ``format``: the figures of that provider's prompt (as ``prompt`` counts them). */
  stats(sessionId: string, format?: PromptFormat): Promise<ContextStatsResult> {
    return this.request("context/stats", format === undefined ? { sessionId } : { sessionId, format });
  }
  checkpoints(sessionId: string): Promise<CheckpointsResult> {
    return this.request("context/checkpoints", { sessionId });
  }
  expandCheckpoint(sessionId: string, checkpointId: string): Promise<ExpandResult> {
    return this.request("checkpoint/expand", { sessionId, checkpointId });
  }
  pin(sessionId: string, seq: number, pinned = true): Promise<PinResult> {
    return this.request("message/pin", { sessionId, seq, pinned });
  }

  /** `context/compress` with a `workDoneToken`; its `$/progress` goes to `onProgress`. */
  async compress(sessionId: string, options: { focus?: string; onProgress?: (value: WorkDoneProgress) => void } = {}): Promise<CompressResult> {
    const token = `ctxd-vscode-compress-${process.pid}-${++tokens}`;
    const onProgress = options.onProgress;
    const subscription = onProgress ? this.connection.onProgress(progressType, token, (value) => onProgress(value)) : undefined;
    try {
      return await this.request<CompressResult>("context/compress", {
        sessionId, workDoneToken: token, ...(options.focus ? { focus: options.focus } : {}),
      });
    } finally {
      subscription?.dispose();
    }
  }

  // --- goal -------------------------------------------------------------------------------

  getGoal(sessionId: string): Promise<GoalResult> {
    return this.request("goal/get", { sessionId });
  }
  setGoal(sessionId: string, description: string): Promise<GoalResult> {
    return this.request("goal/set", { sessionId, description });
  }
  /** Add (or re-lock) a decision of the active goal, locked. */
  lockDecision(sessionId: string, description: string, locked = true): Promise<GoalResult> {
    const decision: Decision = { description, locked };
    return this.request("goal/update", { sessionId, decisions: [decision] });
  }

  // --- snapshots --------------------------------------------------------------------------

  snapshot(sessionId: string, label?: string): Promise<SnapshotInfo> {
    return this.request("snapshot/create", { sessionId, ...(label ? { label } : {}) });
  }
  listSnapshots(sessionId: string): Promise<SnapshotListResult> {
    return this.request("snapshot/list", { sessionId });
  }
  restoreSnapshot(sessionId: string, snapshotId: string): Promise<SnapshotRestoreResult> {
    return this.request("snapshot/restore", { sessionId, snapshotId });
  }

  daemonStatus(): Promise<DaemonStatusResult> {
    return this.request("daemon/status");
  }

  // --- closing ----------------------------------------------------------------------------

  /** `shutdown` + `exit`, then wait for the child (killing it after `closeGraceMs`). */
  async close(): Promise<void> {
    if (this.exited) {
      return;
    }
    this.closing = true;
    const exited = new Promise<void>((resolve) => {
      if (this.exited) {
        resolve();
      } else {
        this.child.once("exit", () => resolve());
      }
    });
    try {
      await Promise.race([this.request("shutdown"), exited]);
      await this.connection.sendNotification("exit");
    } catch {
      // Already gone: nothing to shut down.
    }
    this.child.stdin?.end();
    const grace = this.options.closeGraceMs ?? 5000;
    const timer = setTimeout(() => this.child.kill("SIGKILL"), grace);
    await exited;
    clearTimeout(timer);
  }

  dispose(): void {
    this.closing = true;
    this.connection.dispose();
    if (!this.exited) {
      this.child.kill();
    }
    this.notificationEmitter.dispose();
    this.exitEmitter.dispose();
  }
}
