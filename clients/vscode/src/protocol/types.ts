// Generated from protocol/schema.json by `python -m ctxd.protocol.generate`; do not edit
// (tests/unit/test_generated_docs.py fails when this file is stale).

// --- named field types ---

export type Role = "assistant" | "system" | "tool" | "user";
export type PromptFormat = "anthropic" | "ollama" | "openai";
export type ExportFormat = "json" | "jsonl" | "markdown";
export type CheckpointLevel = "compact" | "detailed" | "moderate" | "ultra";
export type ReliabilityLevel = "critical" | "high" | "low" | "medium";
export type CompressionLayer = "clip" | "fold" | "prune" | "summarize" | "truncate" | "watermark";
export type ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | ImageBlock;
export type WorkDoneProgress = ProgressBegin | ProgressReport | ProgressEnd;
export type Prompt = OpenAIPrompt | AnthropicPrompt | OllamaPrompt;

// --- types ---

export interface AnthropicMessage {
  role: "assistant" | "user";
  content: (AnthropicText | AnthropicToolUse | AnthropicToolResult | AnthropicThinking)[];
}

/**
 * ``system`` and ``messages`` go straight into ``/v1/messages``. With
 * ``cacheControl`` (the default) ``system`` is a list of text blocks (the client's own
 * system text, then ctxd's goal and checkpoints; one block when there is one part), each
 * with a ``cache_control`` breakpoint, as the last message's last block has; without,
 * ``system`` is a string.
 */
export interface AnthropicPrompt {
  format: "anthropic";
  system: string | AnthropicText[] | null;
  messages: AnthropicMessage[];
  sessionId: string;
  tokens: number;
  tokensEstimated: boolean;
  lastSeq: number;
  messageCount: number;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
  bill?: RequestBill | null;
  appendRoom?: number;
}

export interface AnthropicText {
  type: "text";
  text: string;
  cache_control?: CacheControl | null;
}

export interface AnthropicThinking {
  type: "thinking";
  thinking: string;
  signature: string;
}

export interface AnthropicToolResult {
  type: "tool_result";
  tool_use_id: string;
  content: string;
  is_error?: boolean;
  cache_control?: CacheControl | null;
}

export interface AnthropicToolUse {
  type: "tool_use";
  id: string;
  name: string;
  input: Record<string, unknown>;
  cache_control?: CacheControl | null;
}

export interface Artifact {
  path: string;
  action?: "created" | "deleted" | "modified";
  seq?: number | null;
}

/**
 * The dynamic budget, in tokens.
 *
 * ``usable = contextWindow * usableFraction``; a prompt never exceeds
 * ``maxPromptTokens = usable - reservedOutput``. ``reservedOutput`` is kept for the reply:
 * the session's ``settings.outputTokens`` when set, else the model's output limit (at most
 * ``budget.reserved_output_cap``), else a share of the window; never more than a quarter
 * of the window. ``available`` is what is left for
 * the conversation once the system prompt (with the goal block), pinned messages and
 * checkpoints are paid for, less ``safetyMargin``; compression triggers when ``used``
 * (the conversation's tokens) passes ``triggerAt = available * triggerFraction``.
 *
 * Every figure is in ctxd's own count. ``tokenRatio`` and ``tokenOverhead`` say how the
 * session's provider counts: ``ratio * ctxd's count + overhead`` (what the client sends
 * beside the messages: tool schemas...), learned from the usage pushed messages carry
 * (1.0 and 0 until then); ``maxPromptTokens`` is the provider's room less the overhead,
 * divided by the ratio, so a prompt that fits here fits as the provider counts it.
 */
export interface Budget {
  contextWindow: number;
  usableFraction: number;
  usable: number;
  reservedOutput: number;
  safetyMargin: number;
  maxPromptTokens: number;
  systemTokens: number;
  pinnedTokens: number;
  checkpointTokens: number;
  available: number;
  triggerFraction: number;
  triggerAt: number;
  used: number;
  promptTokens: number;
  free: number;
  tokenRatio?: number;
  tokenOverhead?: number;
}

/**
 * An Anthropic prompt-cache breakpoint: the prompt up to this block is cached.
 */
export interface CacheControl {
  type?: "ephemeral";
}

/**
 * A compressed stretch of conversation: its summary with the facts extracted from
 * it (decisions, files, next steps). ``messageRanges`` are the history messages it stands for, as
 * inclusive runs of sequence numbers; ``checkpoint/expand`` returns those messages whole.
 * A summary covers the user's messages it read too (their words also stay in the prompt,
 * verbatim); a truncation notice covers only what was left out; pinned and system
 * messages, sent whole, are in none.
 */
export interface Checkpoint {
  id: string;
  kind: "folded" | "summary" | "truncated";
  level: CheckpointLevel;
  seqFrom: number;
  seqTo: number;
  messageRanges: ([number, number])[];
  summary: string;
  tokens: number;
  originalTokens: number;
  createdAt: string;
  compressionNumber: number;
  summarizer: string;
  compressedAt?: string | null;
  compressionCount?: number;
  mergedFrom?: string[];
  keyDecisions?: string[];
  filesModified?: string[];
  toolsUsed?: ToolUse[];
  nextSteps?: string[];
  errors?: string[];
  ratio?: number;
}

export interface CheckpointAgedNotification {
  sessionId: string;
  checkpointId: string;
  fromLevel: CheckpointLevel;
  toLevel: CheckpointLevel;
  beforeTokens: number;
  afterTokens: number;
}

export interface CheckpointCreatedNotification {
  sessionId: string;
  checkpoint: Checkpoint;
}

export interface CheckpointMergedNotification {
  sessionId: string;
  mergedIds: string[];
  intoId: string;
  tokens: number;
}

export interface CheckpointRef {
  sessionId: string;
  checkpointId: string;
}

export interface CheckpointsResult {
  sessionId: string;
  checkpoints: Checkpoint[];
  tokens: number;
}

/**
 * Keep the ``keep`` most recently active sessions and delete the rest.
 */
export interface CleanupParams {
  keep: number;
}

/**
 * Delete every session; ``all`` must be true (a guard against accidents).
 */
export interface ClearParams {
  all: boolean;
}

export interface ClientInfo {
  name: string;
  version?: string | null;
}

/**
 * Compress now, whatever the budget says (like ``/compact``); ``focus`` steers the summary.
 */
export interface CompressParams {
  sessionId: string;
  focus?: string | null;
  workDoneToken?: string | number | null;
}

export interface CompressResult {
  sessionId: string;
  compressed: boolean;
  layers: CompressionLayer[];
  beforeTokens: number;
  afterTokens: number;
  checkpointIds?: string[];
  summarizer?: string | null;
  reason?: string | null;
  durationMs?: number;
}

export interface CompressedNotification {
  sessionId: string;
  layers: CompressionLayer[];
  beforeTokens: number;
  afterTokens: number;
  freedTokens: number;
  ratio: number;
  checkpointIds: string[];
  durationMs: number;
  compressionNumber: number;
  summarizer?: string | null;
  trigger?: "auto" | "prompt" | "request";
}

/**
 * ``context/compressing``: a compression stage started (one of six, in order).
 */
export interface CompressingNotification {
  sessionId: string;
  stage: "aging" | "checkpoint" | "identification" | "preparation" | "summarization" | "update" | "validation";
  percentage: number;
  message?: string | null;
}

export interface CompressionFailedNotification {
  sessionId: string;
  reason: string;
  fallback?: string | null;
}

export interface CompressionRecord {
  number: number;
  at: string;
  trigger: string;
  lastSeq: number;
  layers: string[];
  beforeTokens: number;
  afterTokens: number;
  checkpointIds: string[];
  durationMs: number;
  summarizer?: string | null;
  detail?: Record<string, unknown> | null;
}

export interface CompressionSkippedNotification {
  sessionId: string;
  reason: string;
  used: number;
  triggerAt: number;
}

/**
 * ``format``: the figures of a prompt in that provider's shape, as ``context/prompt``
 * with that format counts it (``budget.promptTokens``, ``budget.free`` and
 * ``contextTokens``): the OpenAI and Ollama shapes send no thinking, Anthropic's sends
 * the signed blocks and may need an opening user turn. Absent: the count of the active
 * context itself, which ``session/get`` also gives and which includes signed thinking
 * (so the prompt fits any shape).
 */
export interface ContextStatsParams {
  sessionId: string;
  format?: PromptFormat | null;
}

export interface ContextStatsResult {
  sessionId: string;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  encoding: string;
  tokensEstimated: boolean;
  byRole: Record<string, RoleStats>;
  byKind: Record<string, KindStats>;
  usageDrift: UsageDrift;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
  checkpointTokens: number;
  watermarkSeq: number;
  prunedThroughSeq: number;
  pinned: number[];
  promptCache?: PromptCacheStats;
  bill?: SessionBill | null;
}

/**
 * OpenAI ``custom`` of a freeform tool call (a ``custom`` tool: Codex's ``apply_patch``
 * on the Responses API, ``type: "custom"`` calls on Chat Completions): the text the
 * model wrote for the tool, kept verbatim; it is no JSON.
 */
export interface CustomCall {
  name: string;
  input?: string;
}

/**
 * ``daemon/status``: enough for ``ctxd-cli daemon status`` and for health checks.
 */
export interface DaemonStatusResult {
  pid: number;
  version: string;
  startedAt: string;
  uptimeSeconds: number;
  dataDir: string;
  database: string;
  transports: string[];
  connections: number;
  sessions: number;
  durability: string;
  summarizer: string;
}

export interface Decision {
  description: string;
  locked?: boolean;
  architecture?: boolean;
  seq?: number | null;
}

export interface DeletedSessions {
  deleted: string[];
}

/**
 * Params or result of methods that carry nothing (``null`` and ``{}`` are both accepted).
 */
export type Empty = Record<string, never>;

export interface ExpandResult {
  sessionId: string;
  checkpoint: Checkpoint;
  messages: HistoryMessage[];
}

/**
 * The session as a document (``json``: ctxd's own; ``jsonl``: OpenAI chat messages, one
 * a line; ``markdown``: to read). Each carries every message and the session's past: its
 * context state, checkpoints (active and merged away), goal, snapshots, the record of its
 * compressions and events and its calibration; ``session/import`` of it gives the same
 * session and the same prompt.
 */
export interface ExportParams {
  sessionId: string;
  format?: ExportFormat;
}

export interface ExportResult {
  sessionId: string;
  format: ExportFormat;
  mediaType: string;
  filename: string;
  document: string;
  messageCount: number;
}

/**
 * OpenAI ``function`` of a tool call; ``arguments`` is JSON text, kept verbatim.
 */
export interface FunctionCall {
  name: string;
  arguments?: string;
}

export interface Goal {
  id: string;
  description: string;
  createdAt: string;
  priority?: "high" | "low" | "medium";
  status?: "active" | "completed" | "paused";
  completedAt?: string | null;
  checkpoints?: GoalCheckpoint[];
  decisions?: Decision[];
  artifacts?: Artifact[];
  nextSteps?: string[];
}

/**
 * A milestone of the goal (not to be confused with a compression checkpoint).
 */
export interface GoalCheckpoint {
  description: string;
  status?: "completed" | "in-progress" | "pending";
}

export interface GoalResult {
  sessionId: string;
  goal: Goal | null;
  tokens: number;
}

/**
 * Start a new goal (the previous one, if any, is replaced).
 */
export interface GoalSetParams {
  sessionId: string;
  description: string;
  priority?: "high" | "low" | "medium";
  checkpoints?: GoalCheckpoint[];
  decisions?: Decision[];
}

/**
 * Change the active goal: each field given is applied, others are left alone.
 *
 * Checkpoints and decisions are matched by description (case-insensitive): an
 * existing one is updated, a new one is added.
 */
export interface GoalUpdateParams {
  sessionId: string;
  description?: string | null;
  priority?: "high" | "low" | "medium" | null;
  status?: "active" | "completed" | "paused" | null;
  checkpoints?: GoalCheckpoint[];
  decisions?: Decision[];
  artifacts?: Artifact[];
  nextSteps?: string[] | null;
}

export interface HistoryEntry {
  seq: number;
  createdAt: string;
  tokens: number;
  message: Message;
  status: "compressed" | "context" | "kept" | "rolled_back" | "superseded";
  pruned?: boolean;
  filtered?: boolean;
}

/**
 * A message from history with where it sits.
 */
export interface HistoryMessage {
  seq: number;
  message: Message;
  tokens: number;
  createdAt: string;
}

/**
 * Page through a session's whole history: messages with ``seq >= from``.
 */
export interface HistoryParams {
  sessionId: string;
  from?: number;
  limit?: number;
}

export interface HistoryResult {
  sessionId: string;
  messages: HistoryEntry[];
  nextSeq: number | null;
  messageCount: number;
  model?: string | null;
  provider?: string | null;
  compressions?: CompressionRecord[];
  events?: SessionEvent[];
}

/**
 * Search one session and get the original messages back: what an agent calls to recall
 * something that was summarized away.
 */
export interface HistorySearchParams {
  sessionId: string;
  query: string;
  limit?: number;
  syntax?: "fts" | "words";
}

/**
 * An image that came with a message, as ctxd can send it: what it shows
 * (``description``: a caption or alt text an importer or client wrote) and where it is
 * (``url``, history only). Not the speaker's words: providers get it as one line of text,
 * ``[image: <description>]`` (:func:`image_text`); compression treats it like a tool
 * output (a user message kept verbatim behind the compression boundary is sent without
 * it, a summary quotes it only when there is room); history keeps it.
 */
export interface ImageBlock {
  type: "image";
  description?: string;
  url?: string | null;
}

/**
 * Create a session from a document: ctxd's json, jsonl or markdown exports, or any
 * transcript format ctxd reads (Claude Code JSONL, OpenAI chat, agent trajectories).
 */
export interface ImportParams {
  document: string;
  format?: "aider" | "auto" | "claude_code" | "json" | "jsonl" | "locomo" | "markdown" | "mini_swe_agent" | "openai_chat" | "openhands" | "openhands_events" | "swe_agent";
  sessionId?: string | null;
  title?: string | null;
}

export interface ImportResult {
  sessionIds: string[];
  messageCount: number;
  format: string;
  warnings?: string[];
}

/**
 * ctxd-specific options of ``initialize``.
 *
 * ``token`` is required on TCP connections (read it from the daemon's token file).
 */
export interface InitializationOptions {
  token?: string | null;
}

/**
 * LSP ``InitializeParams``; ctxd reads ``processId``, ``clientInfo`` and its options.
 *
 * Other LSP fields (``capabilities``, ``rootUri``...) are accepted and ignored so an
 * editor's stock LSP client can talk to ctxd unchanged.
 */
export interface InitializeParams {
  processId?: number | null;
  clientInfo?: ClientInfo | null;
  initializationOptions?: InitializationOptions | null;
  capabilities?: Record<string, unknown> | null;
}

export interface InitializeResult {
  serverInfo: ServerInfo;
  capabilities: ServerCapabilities;
}

/**
 * Input tokens of one request (or a session's requests) as the provider bills them,
 * in its count (``budget.tokenRatio`` and ``tokenOverhead`` applied to ctxd's):
 * ``uncached`` at the input price, ``cacheWrite`` written to the prompt cache (Anthropic
 * bills them 1.25x), ``cacheRead`` read from it (about 0.1x). ``billed`` is the sum
 * weighed by the provider's rules ([billing] in docs/configuration.md), in uncached input
 * tokens; ``usd`` the same in US dollars when the model's price is known.
 */
export interface InputBill {
  uncached?: number;
  cacheWrite?: number;
  cacheRead?: number;
  billed?: number;
  usd?: number | null;
}

/**
 * Tokens by content kind across the whole history (blocks: how many of that kind).
 */
export interface KindStats {
  blocks?: number;
  tokens?: number;
}

/**
 * One chat message.
 *
 * ``timestamp`` is an ISO 8601 string kept exactly as sent (it is validated, not
 * reformatted). ``idempotencyKey`` makes a retried push harmless: the same key in the
 * same session returns the original result and stores nothing twice. ``metadata`` is
 * free-form, except ``metadata.observation: true`` on a user message: it carries tool
 * output (agents that return command results as user messages), so it is compressed
 * like tool output instead of being kept verbatim as the user's words; and
 * ``metadata.demonstration: true``: a worked example an agent framework sends as a user
 * message (SWE-agent's ``is_demo``), compressed like the rest of the conversation, and
 * not taken for the agent's task.
 */
export interface Message {
  role: Role;
  content?: string | ContentBlock[] | null;
  name?: string | null;
  toolCallId?: string | null;
  toolCalls?: ToolCall[] | null;
  usage?: Usage | null;
  metadata?: Record<string, unknown> | null;
  timestamp?: string | null;
  idempotencyKey?: string | null;
}

export interface OllamaFunction {
  name: string;
  arguments: Record<string, unknown>;
}

export interface OllamaMessage {
  role: Role;
  content: string;
  thinking?: string | null;
  tool_calls?: OllamaToolCall[] | null;
  tool_name?: string | null;
}

/**
 * ``messages`` goes straight into Ollama's ``/api/chat``.
 */
export interface OllamaPrompt {
  format: "ollama";
  messages: OllamaMessage[];
  sessionId: string;
  tokens: number;
  tokensEstimated: boolean;
  lastSeq: number;
  messageCount: number;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
  bill?: RequestBill | null;
  appendRoom?: number;
}

export interface OllamaToolCall {
  function: OllamaFunction;
}

/**
 * A freeform (custom tool) call's name and the model's text for it.
 */
export interface OpenAICustom {
  name: string;
  input: string;
}

export interface OpenAIFunction {
  name: string;
  arguments: string;
}

export interface OpenAIMessage {
  role: Role;
  content?: string | null;
  name?: string | null;
  tool_calls?: OpenAIToolCall[] | null;
  tool_call_id?: string | null;
}

/**
 * ``messages`` goes straight into ``/v1/chat/completions``; the system prompt is its first message.
 */
export interface OpenAIPrompt {
  format: "openai";
  messages: OpenAIMessage[];
  sessionId: string;
  tokens: number;
  tokensEstimated: boolean;
  lastSeq: number;
  messageCount: number;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
  bill?: RequestBill | null;
  appendRoom?: number;
}

/**
 * A function call (``function``) or a freeform one (``type: "custom"``, ``custom``).
 */
export interface OpenAIToolCall {
  id: string;
  function?: OpenAIFunction;
  type?: "custom" | "function";
  custom?: OpenAICustom;
}

/**
 * ``context/overflow``: what may never be summarized (the user's words, pins, the
 * system part) no longer fits where it must, and ctxd applied the overflow policy.
 * Sent for every fold of the user's words (``reason``: ``user_share`` when they passed
 * ``compression.user_share`` of the prompt, ``prompt`` when the prompt did not fit even
 * after compressing everything else), naming the messages folded or excerpted and how to
 * get them back; when the checkpoints were cut to the room a newest message near the
 * window leaves (the folded words, the summaries made one notice, checkpoints out of the
 * prompt: ``action`` says which); and when nothing can be done (``foldedMessages`` 0 and
 * no ``excerptedSeqs``: ``action`` says context/prompt answers with ContextOverflow).
 * The parts add up to ``promptTokens`` (with a few tokens of priming), as they were
 * before the policy acted.
 */
export interface OverflowNotification {
  sessionId: string;
  policy: "error" | "fold";
  promptTokens: number;
  maxPromptTokens: number;
  systemTokens: number;
  pinnedTokens: number;
  checkpointTokens: number;
  userTokens: number;
  action: string;
  reason: "prompt" | "user_share";
  recentTokens?: number;
  foldedMessages?: number;
  foldedSeqs?: number[];
  excerptedSeqs?: number[];
  checkpointId?: string | null;
}

/**
 * Pin (or unpin) a message: pinned messages are sent verbatim and never compressed.
 */
export interface PinParams {
  sessionId: string;
  seq: number;
  pinned?: boolean;
}

export interface PinResult {
  sessionId: string;
  seq: number;
  pinned: boolean;
  pinnedTokens: number;
  seqs?: number[];
}

export interface ProgressBegin {
  kind: "begin";
  title: string;
  cancellable?: boolean;
  message?: string | null;
  percentage?: number | null;
}

export interface ProgressEnd {
  kind: "end";
  message?: string | null;
}

/**
 * LSP ``$/progress`` for a request that carried a ``workDoneToken``.
 */
export interface ProgressParams {
  token: string | number;
  value: WorkDoneProgress;
}

export interface ProgressReport {
  kind: "report";
  message?: string | null;
  percentage?: number | null;
}

/**
 * How cacheable the prompts handed out were (``context/prompt`` calls served by this
 * daemon since it loaded the session): a prompt that starts with the previous one of
 * the same format (same system part, the previous messages unchanged, new ones only
 * appended) lets the provider reuse its prompt cache; compressions break it.
 */
export interface PromptCacheStats {
  prompts?: number;
  compared?: number;
  prefixKept?: number;
  prefixKeptShare?: number | null;
}

/**
 * Ask for the prompt to send next, in one provider's wire shape. ``cacheControl``
 * (Anthropic shape only): mark prompt-cache breakpoints on the system part and the
 * last message (default on). ``push``: messages to append first, exactly as
 * ``session/push`` does (atomically, idempotency keys honoured), so that a turn costs
 * one round trip (``ctxd proxy`` uses it); the prompt then includes them. If the push
 * fails, the request fails with its error and nothing is stored; if the push succeeds
 * and the prompt then fails (ContextOverflow), the messages stay stored.
 */
export interface PromptParams {
  sessionId: string;
  format?: PromptFormat;
  cacheControl?: boolean;
  push?: Message[] | null;
  supersede?: string[] | null;
  current?: string[] | null;
  preview?: boolean;
}

export interface PushResult {
  sessionId: string;
  messages: PushedMessage[];
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  tokensEstimated: boolean;
  budget: Budget;
  appendRoom?: number;
}

/**
 * Where one pushed message landed; ``duplicate`` means its idempotency key was seen before.
 */
export interface PushedMessage {
  seq: number;
  tokens: number;
  duplicate?: boolean;
}

/**
 * The reliability score: model size x compression penalty x context confidence.
 */
export interface Reliability {
  score: number;
  level: ReliabilityLevel;
  modelFactor: number;
  compressionPenalty: number;
  contextConfidence: number;
  compressionCount: number;
  modelSizeBillions: number | null;
  recommendations?: string[];
}

export interface ReliabilityNotification {
  sessionId: string;
  reliability: Reliability;
  previousLevel?: ReliabilityLevel | null;
}

/**
 * One request's input, through ctxd and as the client's own request (its whole history,
 * whose previous request was its cached prefix) would have been billed, both estimated
 * by one rule (the prefix a prompt shares with the previous one is read from the cache
 * while it lives) so that they compare. ``measured``: the provider reported ctxd's
 * request (``reported``: its usage as billed). On a prompt, the session's totals so
 * far, this request included (``sessionBilled``, ``sessionDirect``, ``sessionRequests``),
 * and the ``sessionMeasured`` requests the provider reported: ``sessionReported`` as
 * it billed them, ``sessionReportedEstimate`` as ctxd estimated them.
 */
export interface RequestBill {
  ctxd: InputBill;
  direct: InputBill;
  measured?: boolean;
  reported?: InputBill | null;
  sessionBilled?: number;
  sessionDirect?: number;
  sessionRequests?: number;
  sessionMeasured?: number;
  sessionReported?: number;
  sessionReportedEstimate?: number;
}

/**
 * What automatic retention did to this database's sessions, and what it is set to.
 *
 * ``removed`` counts every session retention ever deleted (never ``session/delete`` or
 * cleanup on request), ``byReason`` splits it by rule (``max_sessions``, ``max_age``);
 * ``maxSessions``/``maxAgeDays`` are the current settings (0: off).
 */
export interface RetentionSummary {
  removed?: number;
  byReason?: Record<string, number>;
  lastRemovedAt?: string | null;
  maxSessions?: number;
  maxAgeDays?: number;
}

export interface RoleStats {
  messages?: number;
  tokens?: number;
}

export interface SearchHit {
  sessionId: string;
  seq: number;
  role: string;
  snippet: string;
  score: number;
  createdAt: string;
  title?: string | null;
  message?: Message | null;
  status?: string | null;
}

/**
 * Full-text search (SQLite FTS5, ranked by bm25). Words are matched as words (all
 * must appear); ``syntax: "fts"`` passes the query to FTS5 as is (phrases, OR, NEAR, prefix*).
 */
export interface SearchParams {
  query: string;
  sessionId?: string | null;
  limit?: number;
  role?: Role | null;
  syntax?: "fts" | "words";
}

export interface SearchResult {
  query: string;
  hits: SearchHit[];
  tookMs: number;
}

/**
 * What this build supports: clients feature-detect with these lists.
 */
export interface ServerCapabilities {
  methods: string[];
  notifications: string[];
  promptFormats: string[];
  protocolVersion: string;
}

export interface ServerInfo {
  name: string;
  version: string;
}

/**
 * A session's requests as billed (``context/stats``): through ctxd and as sending the
 * whole history directly would have been, under ``provider``'s rules (``cache``: how it
 * caches: ``breakpoints``, ``automatic`` or ``none``), both sides estimated by one rule
 * (a provider reports only ctxd's side: taking it for one side only would weigh a cache
 * that missed, or a provider's own rules, against ctxd). ``ratio`` is ctxd's ``billed``
 * over direct's. ``reported``: the ``measured`` requests as the provider's usage billed
 * them, and ``reportedEstimate`` ctxd's estimate of the same requests, billed: beside
 * each other they say how far the provider cached what ctxd expected. ``passCost``: what
 * the compression passes cost by rewriting what the cache held (tokens billed again as
 * new input, in uncached input tokens), over ``passes`` passes.
 * ``budgetNote``: set when the session's window is below its model's, saying what the
 * smaller budget costs.
 */
export interface SessionBill {
  provider: string;
  cache: string;
  requests?: number;
  measured?: number;
  ctxd?: InputBill;
  direct?: InputBill;
  ratio?: number | null;
  reported?: InputBill | null;
  reportedEstimate?: number | null;
  passes?: number;
  passCost?: number;
  lastRequest?: RequestBill | null;
  budgetNote?: string | null;
}

/**
 * Create a session. The server makes an id when ``sessionId`` is absent.
 *
 * ``contextWindow`` overrides what ctxd would infer from the model; ``systemPrompt``
 * is never compressed and counts against every prompt's budget.
 */
export interface SessionCreateParams {
  sessionId?: string | null;
  model?: string | null;
  provider?: string | null;
  contextWindow?: number | null;
  systemPrompt?: string | null;
  title?: string | null;
  tags?: string[] | null;
  metadata?: Record<string, unknown> | null;
  settings?: SessionSettings | null;
  usageSamples?: ([number, number])[] | null;
}

export interface SessionDeleteResult {
  sessionId: string;
  deletedMessages: number;
}

/**
 * ``session/deleted``: the session and everything it owned are gone.
 *
 * ``reason``: ``request`` (``session/delete``, ``session/cleanup``, ``session/clear``), or the
 * retention rule that removed it: ``max_sessions`` (``sessions.max_sessions``) or ``max_age``
 * (``sessions.max_age_days``); ``detail`` then says what was configured and how the session
 * stood (its last activity, its message count).
 */
export interface SessionDeleted {
  sessionId: string;
  reason?: "max_age" | "max_sessions" | "request";
  detail?: string | null;
}

/**
 * A transition that is not a message: a restore, a settings (mode) change.
 */
export interface SessionEvent {
  at: string;
  kind: string;
  lastSeq: number;
  detail?: Record<string, unknown> | null;
}

/**
 * A session and its running totals (kept up to date on every push, never recomputed).
 */
export interface SessionInfo {
  sessionId: string;
  createdAt: string;
  lastActivity: string;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  contextWindow: number;
  encoding: string;
  tokensEstimated: boolean;
  lastSeq: number;
  compressionCount?: number;
  checkpointCount?: number;
  model?: string | null;
  provider?: string | null;
  title?: string | null;
  tags?: string[];
  systemPrompt?: string | null;
  systemPromptTokens?: number;
  metadata?: Record<string, unknown>;
  settings?: SessionSettings;
  modelInfo?: Record<string, unknown>;
  retentionRemoved?: string[];
}

/**
 * List sessions, most recently active first.
 */
export interface SessionListParams {
  limit?: number | null;
  tag?: string | null;
}

export interface SessionListResult {
  sessions: SessionInfo[];
  retention?: RetentionSummary;
}

/**
 * Append messages to a session, in order, atomically (all or none are stored).
 */
export interface SessionPushParams {
  sessionId: string;
  messages: Message[];
}

/**
 * Params of methods that only name a session.
 */
export interface SessionRef {
  sessionId: string;
}

/**
 * Per-session overrides of the ``[compression]`` and ``[budget]`` configuration
 * (absent: use config).
 */
export interface SessionSettings {
  autoCompress?: boolean | null;
  strategy?: "summarize" | "truncate" | null;
  overflowPolicy?: "error" | "fold" | null;
  keepRecent?: number | null;
  triggerFraction?: number | null;
  outputTokens?: number | null;
  outputFloor?: number | null;
}

/**
 * Change a session's descriptive fields or settings; fields left out stay as they are
 * (``settings`` is merged field by field). ``title: null`` clears the title.
 */
export interface SessionUpdateParams {
  sessionId: string;
  title?: string | null;
  tags?: string[] | null;
  metadata?: Record<string, unknown> | null;
  settings?: SessionSettings | null;
  contextWindow?: number | null;
  systemPrompt?: string | null;
}

/**
 * ``session/updated``: the session's history or active context changed.
 */
export interface SessionUpdated {
  sessionId: string;
  reason: "compressed" | "goal" | "pin" | "push" | "restored" | "supersede" | "updated" | "watermark";
  lastSeq: number;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  pushed?: number;
}

/**
 * A snapshot's content: every user message in full, the other messages of the active
 * context, checkpoints, goal, reasoning (thinking blocks travel with their messages),
 * the watermark, and the metadata.
 */
export interface SnapshotContent {
  info: SnapshotInfo;
  userMessages: SnapshotMessage[];
  messages: SnapshotMessage[];
  checkpoints: Checkpoint[];
  goal?: Goal | null;
  watermarkSeq?: number;
  pinned?: number[];
  thinkingTokens?: number;
}

export interface SnapshotCreateParams {
  sessionId: string;
  label?: string | null;
}

export interface SnapshotCreated {
  sessionId: string;
  snapshot: SnapshotInfo;
}

export interface SnapshotDeleteResult {
  sessionId: string;
  deleted: string[];
}

export interface SnapshotDeleted {
  sessionId: string;
  snapshotIds: string[];
  reason: "age" | "request" | "rolling" | "session";
}

export interface SnapshotError {
  sessionId: string;
  operation: "create" | "delete" | "restore";
  reason: string;
}

export interface SnapshotInfo {
  snapshotId: string;
  sessionId: string;
  createdAt: string;
  trigger: "auto" | "manual" | "restore";
  lastSeq: number;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  checkpointCount: number;
  compressionCount: number;
  userMessageCount: number;
  contextWindow: number;
  compressionRatio: number;
  label?: string | null;
  model?: string | null;
  watermarkSeq?: number;
}

export interface SnapshotListResult {
  sessionId: string;
  snapshots: SnapshotInfo[];
}

export interface SnapshotMessage {
  seq: number;
  message: Message;
  tokens: number;
  inContext: boolean;
}

export interface SnapshotRef {
  sessionId: string;
  snapshotId: string;
}

export interface SnapshotRestoreResult {
  sessionId: string;
  snapshotId: string;
  backupSnapshotId: string;
  rolledBackFrom?: number | null;
  rolledBackTo?: number | null;
  contextTokens?: number;
  goalChanged?: boolean;
  goal?: Goal | null;
  previousGoal?: Goal | null;
  compressed?: boolean;
}

export interface SnapshotRestored {
  sessionId: string;
  snapshotId: string;
  backupSnapshotId: string;
  rolledBackFrom?: number | null;
  rolledBackTo?: number | null;
}

/**
 * Receive this session's notifications on this connection (``"*"``: every session).
 */
export interface SubscribeParams {
  sessionId: string;
}

export interface SubscribeResult {
  subscriptions: string[];
}

/**
 * Plain text.
 */
export interface TextBlock {
  type: "text";
  text: string;
}

/**
 * Model reasoning. Kept in history and snapshots, never sent to providers that reject it.
 */
export interface ThinkingBlock {
  type: "thinking";
  thinking: string;
  signature?: string | null;
}

/**
 * ``context/threshold``: ``warning`` when the conversation passes the compression
 * trigger, ``critical`` when the prompt passes 98% of what may be sent (both, in that
 * order, when one push passes both).
 */
export interface ThresholdNotification {
  sessionId: string;
  level: "critical" | "warning";
  promptTokens: number;
  maxPromptTokens: number;
  used: number;
  triggerAt: number;
}

/**
 * A tool call in OpenAI style (``toolCalls`` of an assistant message): a function call
 * (``function``, JSON arguments) or a freeform call (``type: "custom"``, ``custom``).
 * Either way its result is a ``tool`` message answering its ``id``. The field a call
 * does not have is absent (never ``null``).
 */
export interface ToolCall {
  id: string;
  function?: FunctionCall;
  type?: "custom" | "function";
  custom?: CustomCall;
}

/**
 * The result of a tool call in Anthropic style (inside a user or tool message).
 */
export interface ToolResultBlock {
  type: "tool_result";
  toolUseId: string;
  content?: string | TextBlock[];
  isError?: boolean;
}

export interface ToolUse {
  tool: string;
  count: number;
  notableUses?: string[];
}

/**
 * A tool call in Anthropic style (inside an assistant message).
 */
export interface ToolUseBlock {
  type: "tool_use";
  id: string;
  name: string;
  input?: Record<string, unknown>;
}

/**
 * Token usage the provider reported for the call that produced this message. A push
 * refuses negative or absurd counts (``session/push`` checks them; the type stays open
 * so messages stored by any version always read back).
 */
export interface Usage {
  inputTokens?: number | null;
  outputTokens?: number | null;
  totalTokens?: number | null;
  cacheReadTokens?: number | null;
  cacheWriteTokens?: number | null;
  reasoningTokens?: number | null;
  cachedInputTokens?: number | null;
}

/**
 * Counted tokens against what providers reported, over messages that carried ``usage``.
 *
 * ``outputRatio`` = reported output tokens / ctxd's count of those assistant messages;
 * ``inputRatio`` = reported input tokens / ctxd's count of the context before them.
 * A ratio far from 1.0 means the session's encoding does not match the model's tokenizer.
 */
export interface UsageDrift {
  messagesWithUsage?: number;
  reportedOutputTokens?: number;
  countedOutputTokens?: number;
  outputRatio?: number | null;
  reportedInputTokens?: number;
  countedInputTokens?: number;
  inputRatio?: number | null;
  appliedRatio?: number;
  appliedOverhead?: number;
  samples?: ([number, number])[];
}

/**
 * Set the watermark at a tool call (``toolUseId``) or a message (``seq``); tool
 * blocks before it stop being sent. The watermark only moves forward.
 */
export interface WatermarkParams {
  sessionId: string;
  toolUseId?: string | null;
  seq?: number | null;
}

export interface WatermarkResult {
  sessionId: string;
  changed: boolean;
  watermarkSeq: number;
  toolUseId?: string | null;
  reason?: string | null;
  blocksRemoved?: number;
  tokensFreed?: number;
}

// --- notifications (server -> client) ---

/** Every session notification ctxd sends, by method. */
export interface NotificationMap {
  "checkpoint/aged": CheckpointAgedNotification;
  "checkpoint/created": CheckpointCreatedNotification;
  "checkpoint/merged": CheckpointMergedNotification;
  "context/compressed": CompressedNotification;
  "context/compressing": CompressingNotification;
  "context/compressionFailed": CompressionFailedNotification;
  "context/compressionSkipped": CompressionSkippedNotification;
  "context/overflow": OverflowNotification;
  "context/reliability": ReliabilityNotification;
  "context/threshold": ThresholdNotification;
  "session/deleted": SessionDeleted;
  "session/updated": SessionUpdated;
  "snapshot/created": SnapshotCreated;
  "snapshot/deleted": SnapshotDeleted;
  "snapshot/error": SnapshotError;
  "snapshot/restored": SnapshotRestored;
}
export type NotificationMethod = keyof NotificationMap;
export const NOTIFICATION_METHODS: readonly NotificationMethod[] = [
  "checkpoint/aged",
  "checkpoint/created",
  "checkpoint/merged",
  "context/compressed",
  "context/compressing",
  "context/compressionFailed",
  "context/compressionSkipped",
  "context/overflow",
  "context/reliability",
  "context/threshold",
  "session/deleted",
  "session/updated",
  "snapshot/created",
  "snapshot/deleted",
  "snapshot/error",
  "snapshot/restored",
];

/** A notification as delivered to listeners: method and params together, discriminated by method. */
export type CtxdNotification = {
  [M in NotificationMethod]: { method: M; params: NotificationMap[M] };
}[NotificationMethod];

// --- methods ---

/** Every request's params and result, by method. */
export interface MethodMap {
  "checkpoint/expand": { params: CheckpointRef; result: ExpandResult };
  "context/checkpoints": { params: SessionRef; result: CheckpointsResult };
  "context/compress": { params: CompressParams; result: CompressResult };
  "context/prompt": { params: PromptParams; result: OpenAIPrompt | AnthropicPrompt | OllamaPrompt };
  "context/stats": { params: ContextStatsParams; result: ContextStatsResult };
  "context/watermark": { params: WatermarkParams; result: WatermarkResult };
  "daemon/status": { params: Empty | undefined; result: DaemonStatusResult };
  "daemon/stop": { params: Empty | undefined; result: null };
  "goal/get": { params: SessionRef; result: GoalResult };
  "goal/set": { params: GoalSetParams; result: GoalResult };
  "goal/update": { params: GoalUpdateParams; result: GoalResult };
  "history/search": { params: HistorySearchParams; result: SearchResult };
  "initialize": { params: InitializeParams | undefined; result: InitializeResult };
  "message/pin": { params: PinParams; result: PinResult };
  "session/cleanup": { params: CleanupParams; result: DeletedSessions };
  "session/clear": { params: ClearParams; result: DeletedSessions };
  "session/create": { params: SessionCreateParams | undefined; result: SessionInfo };
  "session/delete": { params: SessionRef; result: SessionDeleteResult };
  "session/export": { params: ExportParams; result: ExportResult };
  "session/get": { params: SessionRef; result: SessionInfo };
  "session/history": { params: HistoryParams; result: HistoryResult };
  "session/import": { params: ImportParams; result: ImportResult };
  "session/list": { params: SessionListParams | undefined; result: SessionListResult };
  "session/push": { params: SessionPushParams; result: PushResult };
  "session/search": { params: SearchParams; result: SearchResult };
  "session/subscribe": { params: SubscribeParams; result: SubscribeResult };
  "session/unsubscribe": { params: SubscribeParams; result: SubscribeResult };
  "session/update": { params: SessionUpdateParams; result: SessionInfo };
  "shutdown": { params: Empty | undefined; result: null };
  "snapshot/create": { params: SnapshotCreateParams; result: SnapshotInfo };
  "snapshot/delete": { params: SnapshotRef; result: SnapshotDeleteResult };
  "snapshot/get": { params: SnapshotRef; result: SnapshotContent };
  "snapshot/list": { params: SessionRef; result: SnapshotListResult };
  "snapshot/restore": { params: SnapshotRef; result: SnapshotRestoreResult };
}
export type Method = keyof MethodMap;

/** ctxd's error codes (protocol/methods.md, Errors). */
export const ErrorCodes = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  InternalError: -32603,
  ServerNotInitialized: -32002,
  UnknownErrorCode: -32001,
  RequestCancelled: -32800,
  SessionNotFound: -33001,
  SessionExists: -33002,
  MessageTooLarge: -33003,
  BatchTooLarge: -33004,
  StorageError: -33005,
  Unauthorized: -33006,
  ContextOverflow: -33010,
  CompressionFailed: -33011,
  CompressionInProgress: -33012,
  CheckpointNotFound: -33013,
  MessageNotFound: -33014,
  SnapshotNotFound: -33020,
  SnapshotFailed: -33021,
  ImportFailed: -33030,
  BackendUnavailable: -33040,
} as const;
