/**
 * What `activate()` returns: ctxd for other extensions, without JSON-RPC. Every call
 * goes through the extension's one connection (waiting for it while it (re)connects).
 * No `vscode` import: the same object is tested in node against a real daemon.
 */
import { CtxdSupervisor } from "./protocol/supervisor";
import {
  ContextStatsResult, CtxdNotification, Message, Prompt, PromptFormat, PushResult, SessionCreateParams,
  SessionInfo,
} from "./protocol/types";

export interface CtxdSubscription {
  dispose(): void;
}

export interface CtxdApi {
  /** The version of this API; additions keep the major number. */
  readonly apiVersion: 1;
  /** Create a session (ctxd makes the id when `sessionId` is absent). */
  createSession(params?: SessionCreateParams): Promise<SessionInfo>;
  /** Append messages (OpenAI- or Anthropic-shaped, or ctxd's camelCase); resolves once stored. */
  push(sessionId: string, messages: Message[]): Promise<PushResult>;
  /** The prompt to send next, in a provider's wire shape (`messages`, and `system` for Anthropic). */
  prompt(sessionId: string, format?: PromptFormat): Promise<Prompt>;
  /** Token counts, the budget (`budget.promptTokens` / `budget.maxPromptTokens`) and reliability. */
  stats(sessionId: string): Promise<ContextStatsResult>;
  /** Notifications of one session (or `*` for all): `session/updated`, `context/compressed`... */
  subscribe(sessionId: string, listener: (notification: CtxdNotification) => void): CtxdSubscription;
  /** Any other ctxd method (protocol/methods.md), for what the helpers above do not cover. */
  request<R = unknown>(method: string, params?: object): Promise<R>;
}

export function createApi(supervisor: CtxdSupervisor): CtxdApi {
  return {
    apiVersion: 1,
    async createSession(params: SessionCreateParams = {}): Promise<SessionInfo> {
      return (await supervisor.ready()).createSession(params);
    },
    async push(sessionId: string, messages: Message[]): Promise<PushResult> {
      return (await supervisor.ready()).push(sessionId, messages);
    },
    async prompt(sessionId: string, format: PromptFormat = "openai"): Promise<Prompt> {
      return (await supervisor.ready()).prompt(sessionId, format);
    },
    async stats(sessionId: string): Promise<ContextStatsResult> {
      return (await supervisor.ready()).stats(sessionId);
    },
    subscribe(sessionId: string, listener: (notification: CtxdNotification) => void): CtxdSubscription {
      // The extension's connection subscribes to "*": filter here.
      return supervisor.onNotification((n) => {
        if (sessionId === "*" || n.params.sessionId === sessionId) {
          listener(n);
        }
      });
    },
    async request<R = unknown>(method: string, params?: object): Promise<R> {
      return (await supervisor.ready()).request<R>(method, params);
    },
  };
}
