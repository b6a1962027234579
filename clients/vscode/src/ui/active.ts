/**
 * Which session the status bar, the prompt preview and palette commands act on: the one
 * the user picked, or (following, the default) the last one something pushed to.
 */
import { Emitter, Event } from "vscode-jsonrpc/node";
import { CtxdNotification } from "../protocol/types";

export class ActiveSession {
  private readonly emitter = new Emitter<string | undefined>();
  private id: string | undefined;
  private followLatest = true;

  readonly onDidChange: Event<string | undefined> = this.emitter.event;

  get sessionId(): string | undefined {
    return this.id;
  }

  get following(): boolean {
    return this.followLatest;
  }

  private set(id: string | undefined): void {
    if (id !== this.id) {
      this.id = id;
      this.emitter.fire(id);
    }
  }

  /** The user chose this session: stay on it. */
  pick(sessionId: string): void {
    this.followLatest = false;
    this.set(sessionId);
  }

  /** Go back to following whichever session was pushed to last (`latest`: the most recent one now). */
  follow(latest: string | undefined): void {
    this.followLatest = true;
    this.set(latest);
  }

  /** A session to show when none is chosen yet (the most recently active one). */
  offer(sessionId: string | undefined): void {
    if (this.id === undefined) {
      this.set(sessionId);
    }
  }

  observe(n: CtxdNotification): void {
    if (n.method === "session/deleted" && n.params.sessionId === this.id) {
      this.followLatest = true;
      this.set(undefined);
    } else if (this.followLatest && n.method === "session/updated" && n.params.reason === "push") {
      this.set(n.params.sessionId);
    }
  }

  dispose(): void {
    this.emitter.dispose();
  }
}
