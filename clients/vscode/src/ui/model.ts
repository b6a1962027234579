/**
 * What the UI shows, as pure functions of ctxd's data: status bar text and level,
 * tree labels, notification messages, the text of the read-only documents, and the
 * `ctxd:` URIs. No `vscode` import: tested directly.
 */
import {
  Budget, Checkpoint, CtxdNotification, ExpandResult, HistoryEntry, InputBill, Message, Prompt, SearchHit,
  SessionBill, SessionInfo, SnapshotInfo,
} from "../protocol/types";

export function formatTokens(n: number): string {
  if (n < 1000) {
    return String(n);
  }
  if (n < 10_000) {
    return `${(n / 1000).toFixed(1).replace(/\.0$/, "")}k`;
  }
  if (n < 1_000_000) {
    return `${Math.round(n / 1000)}k`;
  }
  return `${(n / 1_000_000).toFixed(1).replace(/\.0$/, "")}M`;
}

/** `ok`; `trigger`: the conversation passed the compression trigger; `overflow`: the prompt does not fit. */
export type BudgetLevel = "ok" | "trigger" | "overflow";

export function budgetLevel(budget: Pick<Budget, "promptTokens" | "maxPromptTokens" | "used" | "triggerAt">,
                            overflowed = false): BudgetLevel {
  if (overflowed || budget.promptTokens > budget.maxPromptTokens) {
    return "overflow";
  }
  if (budget.triggerAt > 0 && budget.used >= budget.triggerAt) {
    return "trigger";
  }
  return "ok";
}

export function sessionLabel(s: Pick<SessionInfo, "sessionId" | "title">): string {
  return s.title?.trim() || s.sessionId;
}

export type StatusLevel = BudgetLevel | "offline" | "idle";

export interface StatusInput {
  connection: "starting" | "connected" | "disconnected" | "failed" | "stopped";
  problem?: string;
  session?: Pick<SessionInfo, "sessionId" | "title">;
  budget?: Budget;
  overflowed?: boolean;
  compressing?: { stage: string; percentage: number };
  bill?: SessionBill | null;
}

export interface StatusView {
  text: string;
  tooltip: string;
  level: StatusLevel;
}

export function statusView(input: StatusInput): StatusView {
  if (input.connection === "failed") {
    return { text: "$(error) ctxd", tooltip: `ctxd is not running: ${input.problem ?? "it could not start"}`, level: "offline" };
  }
  if (input.connection !== "connected") {
    const what = input.connection === "disconnected" ? `reconnecting${input.problem ? ` (${input.problem})` : ""}` : input.connection;
    return { text: "$(sync~spin) ctxd", tooltip: `ctxd: ${what}`, level: "offline" };
  }
  if (!input.session || !input.budget) {
    return { text: "$(database) ctxd", tooltip: "ctxd: no session yet. Click to pick one.", level: "idle" };
  }
  const b = input.budget;
  const level = budgetLevel(b, input.overflowed);
  const percent = b.maxPromptTokens > 0 ? Math.round((100 * b.promptTokens) / b.maxPromptTokens) : 0;
  const icon = input.compressing ? "$(sync~spin)" : level === "overflow" ? "$(error)" : level === "trigger" ? "$(warning)" : "$(database)";
  const text = `${icon} ${formatTokens(b.promptTokens)}/${formatTokens(b.maxPromptTokens)}`;
  const lines = [
    `ctxd: ${sessionLabel(input.session)}`,
    `prompt ${b.promptTokens} of ${b.maxPromptTokens} tokens (${percent}%), window ${b.contextWindow}`,
    `conversation ${b.used}, compression at ${b.triggerAt}`,
  ];
  if (input.compressing) {
    lines.push(`compressing: ${input.compressing.stage} ${input.compressing.percentage}%`);
  }
  lines.push(...billLines(input.bill));
  if (level === "overflow") {
    lines.push("The prompt does not fit: compress, unpin, or raise the window.");
  } else if (level === "trigger") {
    lines.push("Past the compression trigger.");
  }
  lines.push("Click to pick the session.");
  return { text, tooltip: lines.join("\n"), level };
}

function dollars(usd: number | null | undefined): string {
  return usd === null || usd === undefined ? "" : usd < 1 ? ` ($${usd.toFixed(4)})` : ` ($${usd.toFixed(2)})`;
}

function cacheSplit(b: InputBill, provider: string): string {
  return `  read ${formatTokens(b.cacheRead ?? 0)} from ${provider}'s cache, wrote ${formatTokens(b.cacheWrite ?? 0)}, ` +
    `uncached ${formatTokens(b.uncached ?? 0)}`;
}

/**
 * What the session's requests were billed (input tokens, in uncached-token units), against
 * going direct. Both sides are ctxd's estimates (one rule, so that they compare), and say so;
 * once the provider reported some requests, what it billed for them goes beside ctxd's
 * estimate of the same requests: how far the provider cached what ctxd expected.
 */
export function billLines(bill: SessionBill | null | undefined): string[] {
  if (!bill || !bill.requests) {
    return [];
  }
  // (the wire omits zero fields)
  const c = bill.ctxd ?? {};
  const lines = [
    `estimated: billed ${formatTokens(Math.round(c.billed ?? 0))} input tokens${dollars(c.usd)} over ${bill.requests} requests` +
      (bill.ratio !== null && bill.ratio !== undefined ? `, ${bill.ratio.toFixed(2)}× direct` : ""),
    cacheSplit(c, bill.provider),
  ];
  if (bill.passes) {
    lines.push(`  ${bill.passes} compressions billed ${formatTokens(Math.round(bill.passCost ?? 0))} again`);
  }
  if (bill.measured && bill.reported) {
    const r = bill.reported;
    lines.push(
      `provider reported ${bill.measured} requests: billed ${formatTokens(Math.round(r.billed ?? 0))}${dollars(r.usd)} ` +
        `(ctxd estimated ${formatTokens(Math.round(bill.reportedEstimate ?? 0))})`,
      cacheSplit(r, bill.provider),
    );
  }
  if (bill.budgetNote) {
    lines.push(`  ${bill.budgetNote}`);
  }
  return lines;
}

// --- tree labels ----------------------------------------------------------------------------

export function ranges(checkpoint: Pick<Checkpoint, "messageRanges" | "seqFrom" | "seqTo">): string {
  const runs = checkpoint.messageRanges.length ? checkpoint.messageRanges : [[checkpoint.seqFrom, checkpoint.seqTo]];
  return runs.map(([a, b]) => (a === b ? `#${a}` : `#${a}–${b}`)).join(", ");
}

export function checkpointLabel(c: Checkpoint): { label: string; description: string } {
  return { label: `${c.level} ${c.kind}`, description: `${formatTokens(c.tokens)} tok · ${ranges(c)}` };
}

export function snapshotLabel(s: SnapshotInfo): { label: string; description: string } {
  const when = s.createdAt.replace("T", " ").replace(/\.\d+/, "").replace(/Z$|\+00:00$/, "");
  return { label: s.label?.trim() || `${s.trigger} snapshot`, description: `${when} · #${s.lastSeq} · ${formatTokens(s.contextTokens)} tok` };
}

export function sessionDescription(s: SessionInfo): string {
  return `${s.messageCount} msgs · ${formatTokens(s.contextTokens)} tok`;
}

// --- notifications as messages ------------------------------------------------------------

export interface NotifyPrefs {
  compression: boolean;
  overflow: boolean;
  reliability: boolean;
  threshold: boolean;
}

export interface UserMessage {
  severity: "info" | "warning" | "error";
  text: string;
}

/** The message a notification deserves under the user's preferences, or undefined. */
export function describeNotification(n: CtxdNotification, prefs: NotifyPrefs, title: string): UserMessage | undefined {
  switch (n.method) {
    case "context/compressed":
      return prefs.compression
        ? { severity: "info", text: `ctxd compressed "${title}": ${formatTokens(n.params.beforeTokens)} → ${formatTokens(n.params.afterTokens)} tokens (${n.params.layers.join(", ")}).` }
        : undefined;
    case "context/compressionFailed":
      return prefs.compression
        ? { severity: "warning", text: `ctxd could not compress "${title}": ${n.params.reason}${n.params.fallback ? ` (did ${n.params.fallback} instead)` : ""}.` }
        : undefined;
    case "context/overflow":
      if (!prefs.overflow) {
        return undefined;
      }
      if (n.params.reason === "user_share") {
        // A fold past the user's share: the prompt fits; say which messages and how to get them back.
        return { severity: "info", text: `ctxd folded user messages of "${title}": ${n.params.action}.` };
      }
      return { severity: (n.params.foldedMessages || n.params.excerptedSeqs?.length) ? "warning" : "error",
               text: `"${title}" no longer fits: the prompt is ${n.params.promptTokens} tokens of ${n.params.maxPromptTokens} (${n.params.action}).` };
    case "context/reliability": {
      if (!prefs.reliability) {
        return undefined;
      }
      const r = n.params.reliability;
      const advice = r.recommendations?.length ? ` ${r.recommendations[0]}` : "";
      const severity = r.level === "critical" || r.level === "low" ? "warning" : "info";
      return { severity, text: `ctxd reliability of "${title}": ${n.params.previousLevel ?? "?"} → ${r.level} (${r.score.toFixed(2)}).${advice}` };
    }
    case "context/threshold":
      return prefs.threshold
        ? { severity: n.params.level === "critical" ? "warning" : "info", text: `"${title}" passed the ${n.params.level} threshold: prompt ${n.params.promptTokens} of ${n.params.maxPromptTokens} tokens.` }
        : undefined;
    case "snapshot/error":
      return { severity: "error", text: `ctxd snapshot ${n.params.operation} failed for "${title}": ${n.params.reason}` };
    default:
      return undefined;
  }
}

// --- documents --------------------------------------------------------------------------------

export type CtxdDocument =
  | { kind: "message"; sessionId: string; seq: number }
  | { kind: "checkpoint"; sessionId: string; checkpointId: string }
  | { kind: "prompt"; sessionId: string; format: "openai" | "anthropic" | "ollama" };

export const SCHEME = "ctxd";

/** The path of a document's `ctxd:` URI (its extension picks the language). */
export function documentPath(doc: CtxdDocument): string {
  const id = encodeURIComponent(doc.sessionId);
  switch (doc.kind) {
    case "message":
      return `/message/${id}/${doc.seq}.md`;
    case "checkpoint":
      return `/checkpoint/${id}/${encodeURIComponent(doc.checkpointId)}.md`;
    case "prompt":
      return `/prompt/${id}/${doc.format}.json`;
  }
}

export function parseDocumentPath(p: string): CtxdDocument | undefined {
  const m = /^\/(message|checkpoint|prompt)\/([^/]+)\/([^/]+)\.(md|json)$/.exec(p);
  if (!m) {
    return undefined;
  }
  const sessionId = decodeURIComponent(m[2]);
  const last = decodeURIComponent(m[3]);
  if (m[1] === "message" && /^\d+$/.test(last)) {
    return { kind: "message", sessionId, seq: Number(last) };
  }
  if (m[1] === "checkpoint") {
    return { kind: "checkpoint", sessionId, checkpointId: last };
  }
  if (m[1] === "prompt" && (last === "openai" || last === "anthropic" || last === "ollama")) {
    return { kind: "prompt", sessionId, format: last };
  }
  return undefined;
}

/** A message's content as text: strings, text blocks, tool calls and results, reasoning. */
export function messageText(m: Message): string {
  const parts: string[] = [];
  if (typeof m.content === "string") {
    parts.push(m.content);
  } else if (Array.isArray(m.content)) {
    for (const block of m.content) {
      switch (block.type) {
        case "text":
          parts.push(block.text);
          break;
        case "thinking":
          parts.push(`(thinking) ${block.thinking}`);
          break;
        case "tool_use":
          parts.push(`→ ${block.name}(${JSON.stringify(block.input)})`);
          break;
        case "tool_result": {
          const content = typeof block.content === "string" ? block.content : (block.content ?? []).map((b) => b.text).join("\n");
          parts.push(`← ${block.toolUseId}: ${content}`);
          break;
        }
      }
    }
  }
  for (const call of m.toolCalls ?? []) {
    const text = call.custom ? call.custom.input : call.function?.arguments;
    parts.push(`→ ${call.custom?.name ?? call.function?.name ?? ""}(${text ?? ""})`);
  }
  return parts.join("\n\n");
}

function heading(seq: number, m: Message, extra: string): string {
  const who = m.role === "tool" && m.toolCallId ? `tool (${m.toolCallId})` : m.role;
  return `### #${seq} ${who}${extra}`;
}

/** A search hit in its context: the messages around it, the hit marked. */
export function renderContext(session: Pick<SessionInfo, "sessionId" | "title">, entries: HistoryEntry[], focus: number): string {
  const out = [`# ${sessionLabel(session)}`, "", `Message #${focus} in context (session \`${session.sessionId}\`).`, ""];
  for (const e of entries) {
    const marks = [e.seq === focus ? " ◀ hit" : "", e.status !== "context" ? ` (${e.status.replace("_", " ")})` : ""].join("");
    out.push(heading(e.seq, e.message, marks), "", messageText(e.message) || "_(empty)_", "");
  }
  return out.join("\n");
}

export function renderExpanded(session: Pick<SessionInfo, "sessionId" | "title">, expanded: ExpandResult): string {
  const c = expanded.checkpoint;
  const out = [
    `# ${sessionLabel(session)}: checkpoint ${c.id}`, "",
    `${c.level} ${c.kind}, ${c.tokens} tokens for ${c.originalTokens} (${ranges(c)}), by ${c.summarizer}.`, "",
    "## Summary", "", c.summary, "", "## Original messages", "",
  ];
  for (const m of expanded.messages) {
    out.push(heading(m.seq, m.message, ""), "", messageText(m.message) || "_(empty)_", "");
  }
  return out.join("\n");
}

/** The prompt exactly as it would be sent (the provider's wire shape), then ctxd's figures. */
export function renderPrompt(prompt: Prompt): string {
  const wire: Record<string, unknown> = prompt.format === "anthropic"
    ? { system: prompt.system, messages: prompt.messages }
    : { messages: prompt.messages };
  const about = {
    format: prompt.format, sessionId: prompt.sessionId, tokens: prompt.tokens, lastSeq: prompt.lastSeq,
    maxPromptTokens: prompt.budget.maxPromptTokens, compressionCount: prompt.compressionCount,
    checkpointCount: prompt.checkpointCount, reliability: prompt.reliability.level,
  };
  return `${JSON.stringify({ ...wire, ctxd: about }, null, 2)}\n`;
}

export function hitLabel(hit: SearchHit): { label: string; description: string; detail: string } {
  const snippet = hit.snippet.replace(/\s+/g, " ").trim();
  return {
    label: `${hit.role} #${hit.seq}: ${snippet.slice(0, 80)}`,
    description: hit.title?.trim() || hit.sessionId,
    detail: snippet,
  };
}
