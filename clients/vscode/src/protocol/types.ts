/**
 * The parts of ctxd's protocol this extension uses, as TypeScript types. The source of
 * truth is protocol/schema.json (generated from ctxd/protocol/); field names and
 * optionality follow it.
 */

export type Role = "system" | "user" | "assistant" | "tool";
export type PromptFormat = "openai" | "anthropic" | "ollama";
export type ExportFormat = "json" | "jsonl" | "markdown";
export type CheckpointLevel = "detailed" | "moderate" | "compact" | "ultra";
export type ReliabilityLevel = "high" | "medium" | "low" | "critical";
export type CompressionLayer = "clip" | "fold" | "prune" | "summarize" | "truncate" | "watermark";

export interface TextBlock { type: "text"; text: string }
export interface ToolUseBlock { type: "tool_use"; id: string; name: string; input: Record<string, unknown> }
export interface ToolResultBlock {
  type: "tool_result";
  toolUseId: string;
  content?: string | TextBlock[] | null;
  isError?: boolean;
}
export interface ThinkingBlock { type: "thinking"; thinking: string; signature?: string | null }
export type ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock;

export interface FunctionCall { name: string; arguments?: string }
export interface ToolCall { id: string; function: FunctionCall; type?: "function" }

export interface Usage {
  inputTokens?: number | null;
  outputTokens?: number | null;
  totalTokens?: number | null;
  cacheReadTokens?: number | null;
  cacheWriteTokens?: number | null;
  reasoningTokens?: number | null;
}

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

export interface SessionSettings {
  autoCompress?: boolean | null;
  strategy?: "summarize" | "truncate" | null;
  overflowPolicy?: "error" | "fold" | null;
  keepRecent?: number | null;
  triggerFraction?: number | null;
}

export interface ServerInfo { name: string; version: string }
export interface ServerCapabilities {
  methods: string[];
  notifications: string[];
  promptFormats: string[];
  protocolVersion: string;
}
export interface InitializeResult { serverInfo: ServerInfo; capabilities: ServerCapabilities }

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
}

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
}

export interface SessionListResult { sessions: SessionInfo[] }
export interface SessionDeleteResult { sessionId: string; deletedMessages: number }

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

export interface PushedMessage { seq: number; tokens: number; duplicate?: boolean }
export interface PushResult {
  sessionId: string;
  messages: PushedMessage[];
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  tokensEstimated: boolean;
  budget: Budget;
}

interface PromptCommon {
  sessionId: string;
  tokens: number;
  tokensEstimated: boolean;
  lastSeq: number;
  messageCount: number;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
}
export interface OpenAIPrompt extends PromptCommon { format: "openai"; messages: Record<string, unknown>[] }
export interface AnthropicPrompt extends PromptCommon {
  format: "anthropic";
  system: string | Record<string, unknown>[] | null;
  messages: Record<string, unknown>[];
}
export interface OllamaPrompt extends PromptCommon { format: "ollama"; messages: Record<string, unknown>[] }
export type Prompt = OpenAIPrompt | AnthropicPrompt | OllamaPrompt;

export interface ContextStatsResult {
  sessionId: string;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  encoding: string;
  tokensEstimated: boolean;
  budget: Budget;
  reliability: Reliability;
  compressionCount: number;
  checkpointCount: number;
  checkpointTokens: number;
  watermarkSeq: number;
  prunedThroughSeq: number;
  pinned: number[];
}

export interface Checkpoint {
  id: string;
  kind: "folded" | "summary" | "truncated";
  level: CheckpointLevel;
  seqFrom: number;
  seqTo: number;
  messageRanges: [number, number][];
  summary: string;
  tokens: number;
  originalTokens: number;
  createdAt: string;
  compressionNumber: number;
  summarizer: string;
  keyDecisions?: string[];
}
export interface CheckpointsResult { sessionId: string; checkpoints: Checkpoint[]; tokens: number }

export interface HistoryMessage { seq: number; message: Message; tokens: number; createdAt: string }
export interface ExpandResult { sessionId: string; checkpoint: Checkpoint; messages: HistoryMessage[] }

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

export interface Decision { description: string; locked?: boolean; architecture?: boolean; seq?: number | null }
export interface GoalCheckpoint { description: string; status?: "pending" | "in-progress" | "completed" }
export interface Goal {
  id: string;
  description: string;
  createdAt: string;
  priority?: "high" | "medium" | "low";
  status?: "active" | "completed" | "paused";
  checkpoints?: GoalCheckpoint[];
  decisions?: Decision[];
  nextSteps?: string[];
}
export interface GoalResult { sessionId: string; goal: Goal | null; tokens: number }

export interface PinResult { sessionId: string; seq: number; pinned: boolean; pinnedTokens: number; seqs?: number[] }

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
}
export interface SnapshotListResult { sessionId: string; snapshots: SnapshotInfo[] }
export interface SnapshotRestoreResult {
  sessionId: string;
  snapshotId: string;
  backupSnapshotId: string;
  rolledBackFrom?: number | null;
  rolledBackTo?: number | null;
  contextTokens?: number;
}

export interface ExportResult {
  sessionId: string;
  format: ExportFormat;
  mediaType: string;
  filename: string;
  document: string;
  messageCount: number;
}

export interface SearchParams {
  query: string;
  sessionId?: string | null;
  limit?: number;
  role?: Role | null;
  syntax?: "words" | "fts";
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
export interface SearchResult { query: string; hits: SearchHit[]; tookMs: number }

export interface HistoryEntry {
  seq: number;
  createdAt: string;
  tokens: number;
  message: Message;
  status: "compressed" | "context" | "kept" | "rolled_back";
  pruned?: boolean;
}
export interface HistoryResult { sessionId: string; messages: HistoryEntry[]; nextSeq: number | null; messageCount: number }

export interface DaemonStatusResult {
  pid: number;
  version: string;
  dataDir: string;
  database: string;
  transports: string[];
  connections: number;
  sessions: number;
}

// --- notifications (server -> client) ---------------------------------------------------

export interface SessionUpdated {
  sessionId: string;
  reason: "compressed" | "goal" | "pin" | "push" | "restored" | "updated" | "watermark";
  lastSeq: number;
  messageCount: number;
  tokenCount: number;
  contextTokens: number;
  pushed?: number;
}
export interface SessionDeleted { sessionId: string; reason?: "max_age" | "max_sessions" | "request"; detail?: string | null }
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
export interface CompressingNotification { sessionId: string; stage: string; percentage: number; message?: string | null }
export interface CompressionFailedNotification { sessionId: string; reason: string; fallback?: string | null }
export interface CompressionSkippedNotification { sessionId: string; reason: string; used: number; triggerAt: number }
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
  /** user_share: the user's words passed their share (the prompt may fit); prompt: it did not fit. */
  reason: "prompt" | "user_share";
  recentTokens?: number;
  foldedMessages?: number;
  foldedSeqs?: number[];
  excerptedSeqs?: number[];
  checkpointId?: string | null;
}
export interface ReliabilityNotification { sessionId: string; reliability: Reliability; previousLevel?: ReliabilityLevel | null }
export interface ThresholdNotification {
  sessionId: string;
  level: "warning" | "critical";
  promptTokens: number;
  maxPromptTokens: number;
  used: number;
  triggerAt: number;
}
export interface CheckpointCreatedNotification { sessionId: string; checkpoint: Checkpoint }
export interface CheckpointMergedNotification { sessionId: string; mergedIds: string[]; intoId: string; tokens: number }
export interface CheckpointAgedNotification {
  sessionId: string;
  checkpointId: string;
  fromLevel: CheckpointLevel;
  toLevel: CheckpointLevel;
  beforeTokens: number;
  afterTokens: number;
}
export interface SnapshotCreatedNotification { sessionId: string; snapshot: SnapshotInfo }
export interface SnapshotDeletedNotification { sessionId: string; snapshotIds: string[]; reason: string }
export interface SnapshotRestoredNotification {
  sessionId: string;
  snapshotId: string;
  backupSnapshotId: string;
  rolledBackFrom?: number | null;
  rolledBackTo?: number | null;
}
export interface SnapshotErrorNotification { sessionId: string; operation: "create" | "delete" | "restore"; reason: string }

/** Every session notification ctxd sends, by method. */
export interface NotificationMap {
  "session/updated": SessionUpdated;
  "session/deleted": SessionDeleted;
  "context/compressed": CompressedNotification;
  "context/compressing": CompressingNotification;
  "context/compressionFailed": CompressionFailedNotification;
  "context/compressionSkipped": CompressionSkippedNotification;
  "context/overflow": OverflowNotification;
  "context/reliability": ReliabilityNotification;
  "context/threshold": ThresholdNotification;
  "checkpoint/created": CheckpointCreatedNotification;
  "checkpoint/merged": CheckpointMergedNotification;
  "checkpoint/aged": CheckpointAgedNotification;
  "snapshot/created": SnapshotCreatedNotification;
  "snapshot/deleted": SnapshotDeletedNotification;
  "snapshot/restored": SnapshotRestoredNotification;
  "snapshot/error": SnapshotErrorNotification;
}
export type NotificationMethod = keyof NotificationMap;
export const NOTIFICATION_METHODS: readonly NotificationMethod[] = [
  "session/updated", "session/deleted", "context/compressed", "context/compressing",
  "context/compressionFailed", "context/compressionSkipped", "context/overflow", "context/reliability",
  "context/threshold", "checkpoint/created", "checkpoint/merged", "checkpoint/aged", "snapshot/created",
  "snapshot/deleted", "snapshot/restored", "snapshot/error",
];

/** A notification as delivered to listeners: method and params together, discriminated by method. */
export type CtxdNotification = { [M in NotificationMethod]: { method: M; params: NotificationMap[M] } }[NotificationMethod];

export interface WorkDoneProgressBegin { kind: "begin"; title: string; cancellable?: boolean; message?: string | null; percentage?: number | null }
export interface WorkDoneProgressReport { kind: "report"; message?: string | null; percentage?: number | null }
export interface WorkDoneProgressEnd { kind: "end"; message?: string | null }
export type WorkDoneProgress = WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd;

/** ctxd's error codes the extension reacts to (protocol/methods.md, Errors). */
export const ErrorCodes = {
  SessionNotFound: -33001,
  ContextOverflow: -33010,
  CompressionInProgress: -33012,
  CheckpointNotFound: -33013,
  MessageNotFound: -33014,
  SnapshotNotFound: -33020,
} as const;
