-- ctxd.nvim: the shared ctxd daemon from Neovim (sessions, search, prompts, compression,
-- snapshots, goals, a statusline component) and a Lua API for AI plugins.
--
-- One connection per Neovim: a `ctxd --remote auto` child started on first use (the
-- daemon itself is started by it when none runs, and outlives Neovim), closed on
-- VimLeavePre. See clients/nvim/README.md.

local rpc = require('ctxd.rpc')

local M = {}

M.version = '0.1.0'

local defaults = {
  -- The forwarder; any command that speaks ctxd's protocol on stdio works.
  cmd = { 'ctxd', '--remote', 'auto' },
  env = nil, -- extra environment for it
  session = nil, -- the active session at startup (subscribed to at once)
  format = 'openai', -- default of :CtxdPrompt
  notify = true, -- vim.notify on compression, overflow and failed compressions
  request_timeout = 15000, -- ms, for commands that wait (sync requests)
  statusline = {
    -- function(state) -> string; state: session, contextTokens, maxPromptTokens,
    -- triggerAt, messageCount, compressions, compressing, level, connected,
    -- billed (input tokens billed so far, in uncached-token units), billRatio (x direct)
    format = nil,
  },
}

M.config = vim.deepcopy(defaults)

local conn = nil
local group = nil -- the autocmds' group, once they exist
local autocmds -- defined with setup()
local listeners = {}
local subscribed = {}
local status = {
  session = nil,
  contextTokens = nil,
  maxPromptTokens = nil,
  triggerAt = nil,
  messageCount = nil,
  compressions = 0,
  compressing = false,
  level = nil,
  connected = false,
}
local status_text = ''

-- --- the statusline -------------------------------------------------------------------

local function human(n)
  if n == nil then
    return '?'
  elseif n < 1000 then
    return tostring(n)
  elseif n < 10000 then
    return string.format('%.1fk', n / 1000)
  elseif n < 1000000 then
    return string.format('%dk', math.floor(n / 1000 + 0.5))
  end
  return string.format('%.1fM', n / 1000000)
end

M.human = human

local function default_format(s)
  if not s.session then
    return ''
  end
  local text = 'ctxd ' .. s.session
  if s.contextTokens then
    text = text .. ' ' .. human(s.contextTokens)
    if s.maxPromptTokens and s.maxPromptTokens > 0 then
      text = text .. '/' .. human(s.maxPromptTokens)
        .. string.format(' %d%%', math.floor(100 * s.contextTokens / s.maxPromptTokens + 0.5))
    end
  end
  if s.compressions and s.compressions > 0 then
    text = text .. ' c' .. s.compressions
  end
  if s.compressing then
    text = text .. ' compressing'
  elseif s.level == 'critical' then
    text = text .. ' !!'
  elseif s.level == 'warning' then
    text = text .. ' !'
  end
  if not s.connected then
    text = text .. ' (off)'
  end
  return text
end

local function refresh_status()
  local format = M.config.statusline.format or default_format
  local ok, text = pcall(format, vim.deepcopy(status))
  status_text = ok and (text or '') or 'ctxd: statusline error'
  pcall(vim.cmd, 'redrawstatus')
end

--- The statusline component: a string rebuilt only when a notification arrives, so it
--- is free to call on every redraw.
function M.statusline()
  return status_text
end

--- A copy of what the statusline shows (for a statusline plugin's own formatting).
function M.status()
  return vim.deepcopy(status)
end

-- --- notifications --------------------------------------------------------------------

local function say(message, level)
  vim.notify('ctxd: ' .. message, level or vim.log.levels.INFO)
end

local function apply_budget(budget)
  if budget then
    status.maxPromptTokens = budget.maxPromptTokens
    status.triggerAt = budget.triggerAt
    if budget.promptTokens and budget.maxPromptTokens and budget.promptTokens >= budget.maxPromptTokens then
      status.level = 'critical'
    elseif budget.triggerAt and budget.used and budget.used > budget.triggerAt then
      status.level = 'warning'
    else
      status.level = nil
    end
  end
end

local function load_stats(session_id)
  M.stats(session_id, function(err, stats)
    if err or not stats or status.session ~= session_id then
      return
    end
    status.contextTokens = stats.contextTokens
    status.messageCount = stats.messageCount
    status.compressions = stats.compressionCount or 0
    local bill = stats.bill ~= vim.NIL and stats.bill or nil
    status.billed = bill and bill.ctxd and bill.ctxd.billed or nil
    status.billRatio = bill and bill.ratio ~= vim.NIL and bill.ratio or nil
    apply_budget(stats.budget)
    refresh_status()
  end)
end

local function on_notification(method, params)
  params = params or {}
  if params.sessionId and params.sessionId == status.session then
    if method == 'session/updated' then
      status.contextTokens = params.contextTokens
      status.messageCount = params.messageCount
      if params.reason ~= 'push' then
        load_stats(status.session) -- the budget moves with checkpoints, goals, pins
      end
    elseif method == 'context/compressing' then
      status.compressing = true
    elseif method == 'context/compressed' then
      status.compressing = false
      status.compressions = params.compressionNumber or (status.compressions + 1)
      status.contextTokens = params.afterTokens
      status.level = nil
    elseif method == 'context/compressionFailed' or method == 'context/compressionSkipped' then
      status.compressing = false
    elseif method == 'context/threshold' then
      status.level = params.level
    elseif method == 'session/deleted' then
      status.session = nil
    end
    refresh_status()
  end
  if M.config.notify then
    if method == 'context/compressed' then
      say(string.format('%s compressed: %s -> %s tokens (%s)', params.sessionId, human(params.beforeTokens),
        human(params.afterTokens), table.concat(params.layers or {}, ', ')))
    elseif method == 'context/overflow' then
      if params.reason == 'user_share' then
        say(string.format('%s folded user messages: %s', params.sessionId, params.action or ''))
      else
        say(string.format('%s overflows: %s', params.sessionId, params.action or ''), vim.log.levels.WARN)
      end
    elseif method == 'context/compressionFailed' then
      say(string.format('%s: compression failed: %s', params.sessionId, params.error or params.message or '?'),
        vim.log.levels.WARN)
    end
  end
  for _, fn in ipairs(listeners) do
    local ok, err = pcall(fn, method, params)
    if not ok then
      say('a notification listener failed: ' .. tostring(err), vim.log.levels.ERROR)
    end
  end
end

--- Call fn(method, params) for every notification ctxd sends this Neovim (for the
--- sessions subscribed to). Returns a function that removes it.
function M.on_notification(fn)
  table.insert(listeners, fn)
  return function()
    for i, f in ipairs(listeners) do
      if f == fn then
        table.remove(listeners, i)
        return
      end
    end
  end
end

-- --- the connection -------------------------------------------------------------------

local function on_exit(code, signal, why, expected)
  status.connected = false
  conn = nil
  subscribed = {}
  refresh_status()
  if not expected then
    say('lost the daemon: ' .. why .. ' (the next ctxd command reconnects)', vim.log.levels.ERROR)
  end
end

--- The connection, started when there is none. Returns conn, or nil and why.
function M.connect()
  if conn and conn:alive() then
    return conn
  end
  if not group then -- used without setup(): defaults, and still cleaned up on exit
    autocmds()
  end
  local c, err = rpc.spawn(M.config.cmd, { env = M.config.env, version = M.version }, {
    on_notification = on_notification,
    on_exit = on_exit,
    on_ready = function()
      status.connected = true
      refresh_status()
    end,
  })
  if not c then
    return nil, err
  end
  conn = c
  if status.session then -- after a reconnect: listen again
    M.subscribe(status.session)
    load_stats(status.session)
  end
  return conn
end

local function error_text(err)
  if type(err) ~= 'table' then
    return tostring(err)
  end
  if err.code and err.code ~= -32099 then
    return string.format('%s (%d)', err.message or '?', err.code)
  end
  return err.message or '?'
end

M.error_text = error_text

--- Any ctxd method (protocol/methods.md): callback(err, result) on the main loop.
function M.request(method, params, callback)
  callback = callback or function() end
  if type(params) == 'table' and next(params) == nil then
    params = vim.empty_dict() -- {} would be encoded as [], which no method takes
  end
  local c, why = M.connect()
  if not c then
    vim.schedule(function()
      callback({ code = -32099, message = why }, nil)
    end)
    return
  end
  c:request(method, params, callback)
end

--- The same, waiting (up to timeout ms): returns result, err.
function M.request_sync(method, params, timeout)
  local done, err, result = false, nil, nil
  M.request(method, params, function(e, r)
    done, err, result = true, e, r
  end)
  if not vim.wait(timeout or M.config.request_timeout, function()
    return done
  end, 5) then
    return nil, { code = -32099, message = method .. ' timed out' }
  end
  return result, err
end

--- Close the connection (the daemon keeps running). Also done on VimLeavePre.
function M.stop()
  if conn then
    local c = conn
    conn = nil
    c:close(2000)
  end
  status.connected = false
end

--- What the plugin is connected to: { running, pid, server, session }.
function M.info()
  return {
    running = conn ~= nil and conn:alive(),
    pid = conn and conn.pid or nil,
    server = conn and conn.server_info or nil,
    session = status.session,
    cmd = M.config.cmd,
  }
end

-- --- the API for AI plugins ------------------------------------------------------------

--- Notifications of this session (or '*' for all) go to this Neovim.
function M.subscribe(session_id, callback)
  M.request('session/subscribe', { sessionId = session_id }, function(err, result)
    if not err then
      subscribed[session_id] = true
    end
    if callback then
      callback(err, result)
    end
  end)
end

--- session/create: params as in protocol/methods.md (sessionId, model, contextWindow,
--- systemPrompt, title, ...). A session that exists already is an error (-33xxx).
function M.create(params, callback)
  M.request('session/create', params, callback)
end

--- Append messages ({role, content, ...} in OpenAI or Anthropic shape) to a session.
function M.push(session_id, messages, callback)
  M.request('session/push', { sessionId = session_id, messages = messages }, callback)
end

--- The prompt to send next, in format 'openai' | 'anthropic' | 'ollama'.
function M.prompt(session_id, format, callback)
  M.request('context/prompt', { sessionId = session_id, format = format or M.config.format }, callback)
end

--- Counts, token totals and the budget of a session.
function M.stats(session_id, callback)
  M.request('context/stats', { sessionId = session_id }, callback)
end

--- Make session_id the active one: what the commands act on and the statusline shows.
function M.use(session_id, callback)
  status.session = session_id
  status.contextTokens, status.maxPromptTokens, status.messageCount = nil, nil, nil
  status.compressions, status.compressing, status.level = 0, false, nil
  refresh_status()
  M.subscribe(session_id, function(err)
    if err then
      say('cannot follow ' .. session_id .. ': ' .. error_text(err), vim.log.levels.ERROR)
    end
    load_stats(session_id)
    if callback then
      callback(err)
    end
  end)
end

--- The active session's id, or nil.
function M.session()
  return status.session
end

-- --- setup ----------------------------------------------------------------------------

autocmds = function()
  group = vim.api.nvim_create_augroup('ctxd', { clear = true })
  vim.api.nvim_create_autocmd('VimLeavePre', {
    group = group,
    callback = function()
      M.stop()
    end,
  })
  require('ctxd.commands').buffers(group)
end

function M.setup(opts)
  opts = opts or {}
  if opts.cmd ~= nil and (type(opts.cmd) ~= 'table' or #opts.cmd == 0) then
    error("ctxd.setup: cmd must be a list, e.g. { 'ctxd', '--remote', 'auto' }")
  end
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(defaults), opts)
  autocmds()
  if M.config.session then
    M.use(M.config.session)
  end
end

return M
