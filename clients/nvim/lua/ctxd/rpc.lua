-- The one connection of this Neovim to ctxd: a `ctxd --remote auto` child (the stdio
-- forwarder to the shared daemon) spawned with vim.loop, speaking LSP base-protocol
-- frames on its stdin/stdout.
--
-- Why not vim.lsp.rpc: its start() changed signature in 0.10 and, in 0.7, hides the
-- child's stderr (where the forwarder says why it could not reach the daemon) and its
-- stdin (closing stdin is how the forwarder is told to leave cleanly). The framing is
-- thirty lines; owning it keeps the plugin working from 0.7 to today.

local uv = vim.uv or vim.loop

local M = {}

local Conn = {}
Conn.__index = Conn

local function frame(message)
  local body = vim.json.encode(message)
  return 'Content-Length: ' .. #body .. '\r\n\r\n' .. body
end

local function environ(extra)
  if not extra or vim.tbl_isempty(extra) then
    return nil
  end
  local env = vim.fn.environ()
  for k, v in pairs(extra) do
    env[k] = v
  end
  local list = {}
  for k, v in pairs(env) do
    table.insert(list, k .. '=' .. tostring(v))
  end
  return list
end

--- Spawn `cmd` (a list) and send `initialize`. Returns a connection, or nil and why.
--- handlers: on_notification(method, params), on_exit(code, signal, stderr, expected),
--- on_ready(server_info) (all called on the main loop).
function M.spawn(cmd, opts, handlers)
  opts = opts or {}
  if vim.fn.executable(cmd[1]) ~= 1 then
    return nil, string.format('%s is not an executable on PATH (install ctxd: pip install ctxd, or set '
      .. "cmd in require('ctxd').setup{})", cmd[1])
  end
  local self = setmetatable({
    cmd = cmd,
    handlers = handlers,
    pending = {},
    next_id = 0,
    chunks = {},
    stderr = '',
    closing = false,
    exited = false,
    server_info = nil,
    ready = false,
  }, Conn)
  self.stdin = uv.new_pipe(false)
  self.stdout = uv.new_pipe(false)
  self.stderr_pipe = uv.new_pipe(false)
  local args = {}
  for i = 2, #cmd do
    args[#args + 1] = cmd[i]
  end
  local handle, pid = uv.spawn(cmd[1], {
    args = args,
    stdio = { self.stdin, self.stdout, self.stderr_pipe },
    env = environ(opts.env),
    cwd = opts.cwd,
  }, function(code, signal)
    vim.schedule(function()
      self:_on_exit(code, signal)
    end)
  end)
  if not handle then
    self.stdin:close()
    self.stdout:close()
    self.stderr_pipe:close()
    return nil, string.format('cannot start %s: %s', cmd[1], tostring(pid))
  end
  self.handle, self.pid = handle, pid
  self.stdout:read_start(function(err, chunk)
    if chunk then
      self:_feed(chunk)
    end
  end)
  self.stderr_pipe:read_start(function(err, chunk)
    if chunk then
      self.stderr = (self.stderr .. chunk):sub(-4000)
    end
  end)
  self:request('initialize', {
    processId = vim.fn.getpid(),
    clientInfo = { name = 'ctxd.nvim', version = opts.version },
  }, function(err, result)
    if err then
      return -- every request behind it fails with the same error; on_exit reports the rest
    end
    self.server_info = result and result.serverInfo or {}
    self.ready = true
    self:notify('initialized', vim.empty_dict())
    if handlers.on_ready then
      handlers.on_ready(self.server_info)
    end
  end)
  return self
end

-- Called from the libuv thread context: only split frames here, decode on the main loop.
function Conn:_feed(chunk)
  table.insert(self.chunks, chunk)
  local buf = table.concat(self.chunks)
  self.chunks = {}
  while true do
    local header_end = buf:find('\r\n\r\n', 1, true)
    if not header_end then
      break
    end
    local length = tonumber(buf:sub(1, header_end - 1):match('[Cc]ontent%-[Ll]ength:%s*(%d+)'))
    if not length then
      self.stderr = self.stderr .. '\nctxd.nvim: the forwarder sent a frame without Content-Length'
      self.handle:kill('sigterm')
      return
    end
    local body_end = header_end + 3 + length
    if #buf < body_end then
      break
    end
    local body = buf:sub(header_end + 4, body_end)
    buf = buf:sub(body_end + 1)
    vim.schedule(function()
      self:_dispatch(body)
    end)
  end
  if #buf > 0 then
    self.chunks = { buf }
  end
end

function Conn:_dispatch(body)
  local ok, message = pcall(vim.json.decode, body, { luanil = { object = true } })
  if not ok or type(message) ~= 'table' then
    return
  end
  if message.method then
    if message.id ~= nil then -- ctxd sends no requests; answer one anyway
      self:_write({ jsonrpc = '2.0', id = message.id, error = { code = -32601, message = 'not handled by ctxd.nvim' } })
    elseif self.handlers.on_notification then
      self.handlers.on_notification(message.method, message.params)
    end
    return
  end
  local callback = self.pending[message.id]
  if callback then
    self.pending[message.id] = nil
    callback(message.error, message.result)
  end
end

function Conn:_write(message)
  if self.exited or self.closing then
    return false
  end
  self.stdin:write(frame(message))
  return true
end

--- Send a request; callback(err, result) on the main loop. err is {code, message, data}.
function Conn:request(method, params, callback)
  self.next_id = self.next_id + 1
  local id = self.next_id
  local message = { jsonrpc = '2.0', id = id, method = method }
  if params ~= nil then
    message.params = params
  end
  if not self:_write(message) then
    vim.schedule(function()
      callback({ code = -32099, message = 'the ctxd connection is closed' }, nil)
    end)
    return nil
  end
  self.pending[id] = callback
  return id
end

function Conn:notify(method, params)
  local message = { jsonrpc = '2.0', method = method }
  if params ~= nil then
    message.params = params
  end
  return self:_write(message)
end

function Conn:alive()
  return not self.exited and not self.closing
end

--- The last line the forwarder wrote on stderr (why it exited), without its prefix.
function Conn:reason()
  local last
  for line in self.stderr:gmatch('[^\n]+') do
    if line:match('%S') then
      last = line
    end
  end
  return last and last:gsub('^ctxd %-%-remote: ', ''):gsub('^ctxd: ', '') or nil
end

function Conn:_on_exit(code, signal)
  self.exited = true
  for _, pipe in ipairs({ self.stdin, self.stdout, self.stderr_pipe }) do
    if not pipe:is_closing() then
      pipe:close()
    end
  end
  if not self.handle:is_closing() then
    self.handle:close()
  end
  local pending = self.pending
  self.pending = {}
  local why = self:reason() or string.format('the forwarder exited with code %d', code)
  for _, callback in pairs(pending) do
    callback({ code = -32099, message = why }, nil)
  end
  if self.handlers.on_exit then
    self.handlers.on_exit(code, signal, why, self.closing)
  end
end

--- Leave cleanly: close the forwarder's stdin (it relays what is in flight, then exits,
--- leaving the daemon running); kill it if it has not gone within `timeout` ms.
function Conn:close(timeout)
  if self.exited then
    return true
  end
  self.closing = true
  if not self.stdin:is_closing() then
    self.stdin:shutdown(function()
      if not self.stdin:is_closing() then
        self.stdin:close()
      end
    end)
  end
  local gone = vim.wait(timeout or 2000, function()
    return self.exited
  end, 10)
  if not gone and not self.handle:is_closing() then
    self.handle:kill('sigterm')
    gone = vim.wait(1000, function()
      return self.exited
    end, 10)
  end
  return gone
end

return M
