/**
 * Keeps one ctxd connection alive: starts it, re-subscribes, and restarts it (with a
 * growing delay) when the child dies. A start that cannot succeed (ctxd not installed,
 * a ctxd without the forwarder) stops the retries until `restart()`. No `vscode` here.
 */
import { Disposable, Emitter, Event } from "vscode-jsonrpc/node";
import { ClientOptions, CtxdClient, CtxdStartError, ServerCommand } from "./client";
import { CtxdNotification } from "./types";

export type ConnectionState =
  | { kind: "starting"; attempt: number }
  | { kind: "connected"; client: CtxdClient }
  | { kind: "disconnected"; reason: string; retryInMs: number }
  | { kind: "failed"; error: CtxdStartError }
  | { kind: "stopped" };

export interface SupervisorOptions extends ClientOptions {
  /** What to run; a function so a settings change is picked up on the next start. */
  resolveCommand: () => ServerCommand | CtxdStartError;
  /** Sessions to subscribe to after each (re)connection; `*` for all. */
  subscriptions?: string[];
  firstRetryMs?: number;
  maxRetryMs?: number;
}

export class CtxdSupervisor implements Disposable {
  private readonly stateEmitter = new Emitter<ConnectionState>();
  private readonly notificationEmitter = new Emitter<CtxdNotification>();
  private current: CtxdClient | undefined;
  private stateValue: ConnectionState = { kind: "stopped" };
  private retryTimer: NodeJS.Timeout | undefined;
  private failures = 0;
  private generation = 0;
  private waiters: { resolve: (c: CtxdClient) => void; reject: (e: Error) => void }[] = [];

  readonly onState: Event<ConnectionState> = this.stateEmitter.event;
  /** Notifications from whichever connection is current. */
  readonly onNotification: Event<CtxdNotification> = this.notificationEmitter.event;

  constructor(private readonly options: SupervisorOptions) {}

  get state(): ConnectionState {
    return this.stateValue;
  }

  get client(): CtxdClient | undefined {
    return this.current;
  }

  private setState(state: ConnectionState): void {
    this.stateValue = state;
    if (state.kind === "connected") {
      for (const w of this.waiters.splice(0)) {
        w.resolve(state.client);
      }
    } else if (state.kind === "failed" || state.kind === "stopped") {
      const error = state.kind === "failed" ? state.error : new Error("ctxd is stopped");
      for (const w of this.waiters.splice(0)) {
        w.reject(error);
      }
    }
    this.stateEmitter.fire(state);
  }

  /** The connected client, waiting for a (re)connection in progress; rejects when ctxd cannot start. */
  ready(): Promise<CtxdClient> {
    const state = this.stateValue;
    if (state.kind === "connected") {
      return Promise.resolve(state.client);
    }
    if (state.kind === "failed") {
      return Promise.reject(state.error);
    }
    if (state.kind === "stopped") {
      return Promise.reject(new Error("ctxd is stopped"));
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Start (or, when running, stop and start again: a settings change, "ctxd: Reconnect"). */
  async restart(): Promise<void> {
    await this.stopCurrent();
    this.failures = 0;
    void this.connect();
  }

  start(): void {
    if (this.stateValue.kind === "stopped" || this.stateValue.kind === "failed") {
      this.failures = 0;
      void this.connect();
    }
  }

  private async connect(): Promise<void> {
    const generation = ++this.generation;
    this.clearRetry();
    this.setState({ kind: "starting", attempt: this.failures + 1 });
    const command = this.options.resolveCommand();
    if (command instanceof CtxdStartError) {
      this.setState({ kind: "failed", error: command });
      return;
    }
    let client: CtxdClient;
    try {
      client = await CtxdClient.start(command, this.options);
      for (const sessionId of this.options.subscriptions ?? ["*"]) {
        await client.subscribe(sessionId);
      }
    } catch (err) {
      if (generation !== this.generation) {
        return;
      }
      if (err instanceof CtxdStartError && err.kind !== "exited") {
        this.setState({ kind: "failed", error: err });
      } else {
        this.scheduleRetry(err instanceof Error ? err.message : String(err));
      }
      return;
    }
    if (generation !== this.generation) {
      await client.close();
      return;
    }
    this.current = client;
    this.failures = 0;
    client.onNotification((n) => {
      this.notificationEmitter.fire(n);
    });
    client.onExit(({ code, signal, expected }) => {
      if (this.current !== client) {
        return;
      }
      this.current = undefined;
      if (!expected) {
        this.scheduleRetry(`ctxd exited (${signal ? `signal ${signal}` : `code ${code}`})`);
      }
    });
    this.setState({ kind: "connected", client });
  }

  private scheduleRetry(reason: string): void {
    const first = this.options.firstRetryMs ?? 1000;
    const delay = Math.min(first * 2 ** this.failures, this.options.maxRetryMs ?? 30000);
    this.failures += 1;
    this.setState({ kind: "disconnected", reason, retryInMs: delay });
    this.clearRetry();
    this.retryTimer = setTimeout(() => void this.connect(), delay);
  }

  private clearRetry(): void {
    if (this.retryTimer) {
      clearTimeout(this.retryTimer);
      this.retryTimer = undefined;
    }
  }

  private async stopCurrent(): Promise<void> {
    this.generation += 1;
    this.clearRetry();
    const client = this.current;
    this.current = undefined;
    if (client) {
      await client.close();
    }
  }

  /** Close the connection and stop reconnecting. */
  async stop(): Promise<void> {
    await this.stopCurrent();
    this.setState({ kind: "stopped" });
  }

  dispose(): void {
    void this.stop();
    this.stateEmitter.dispose();
    this.notificationEmitter.dispose();
  }
}
