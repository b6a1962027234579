-- The :Ctxd* commands and the ctxd:// buffers (a message, a prompt, a history).

local M = {}

local function ctxd()
  return require('ctxd')
end

local function fail(message)
  vim.notify('ctxd: ' .. message, vim.log.levels.ERROR)
end

local function info(message)
  vim.notify('ctxd: ' .. message, vim.log.levels.INFO)
end

--- The active session, or nil after telling the user how to pick one.
local function active()
  local id = ctxd().session()
  if not id then
    fail("no session selected: pick one with :CtxdSessions (or require('ctxd').use(id))")
  end
  return id
end

--- A request that waits; nil (after saying why) on error.
local function call(method, params)
  local result, err = ctxd().request_sync(method, params)
  if err then
    fail(method .. ': ' .. ctxd().error_text(err))
    return nil
  end
  return result
end

-- --- rendering ---------------------------------------------------------------------------

local function split(text)
  return vim.split(text or '', '\n', { plain = true })
end

local function append(lines, more)
  for _, line in ipairs(more) do
    table.insert(lines, line)
  end
end

local function show_value(value)
  return split(vim.inspect(value))
end

--- A message's content as lines: text as it is, blocks and tool calls spelled out.
function M.content_lines(message)
  local lines = {}
  local content = message.content
  if type(content) == 'string' then
    append(lines, split(content))
  elseif type(content) == 'table' then
    for _, block in ipairs(content) do
      if type(block) == 'table' and (block.type == 'text' or block.type == 'thinking') then
        if block.type == 'thinking' then
          table.insert(lines, '(thinking)')
        end
        append(lines, split(block.text or block.thinking or ''))
      elseif type(block) == 'table' and block.type == 'tool_result' then
        table.insert(lines, string.format('(tool result %s)', block.tool_use_id or block.toolUseId or ''))
        if type(block.content) == 'string' then
          append(lines, split(block.content))
        else
          append(lines, M.content_lines({ content = block.content }))
        end
      else
        append(lines, show_value(block))
      end
    end
  end
  for _, call_ in ipairs(message.toolCalls or message.tool_calls or {}) do
    local fn = call_['function'] or call_.custom or {}
    local text = fn.arguments or fn.input
    table.insert(lines, string.format('(tool call %s %s)', call_.id or '', fn.name or call_.name or ''))
    append(lines, split(type(text) == 'string' and text or vim.inspect(text or call_)))
  end
  return lines
end

local function scratch(name, lines, filetype)
  local buf = vim.fn.bufnr(name)
  if buf == -1 then
    buf = vim.api.nvim_create_buf(true, true)
    vim.api.nvim_buf_set_name(buf, name)
  end
  vim.api.nvim_buf_set_option(buf, 'modifiable', true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  M.scratch_options(buf, filetype)
  vim.api.nvim_set_current_buf(buf)
  return buf
end

function M.scratch_options(buf, filetype)
  vim.api.nvim_buf_set_option(buf, 'buftype', 'nofile')
  vim.api.nvim_buf_set_option(buf, 'bufhidden', 'hide')
  vim.api.nvim_buf_set_option(buf, 'swapfile', false)
  vim.api.nvim_buf_set_option(buf, 'modified', false)
  vim.api.nvim_buf_set_option(buf, 'modifiable', false)
  if filetype then
    vim.api.nvim_buf_set_option(buf, 'filetype', filetype)
  end
end

--- The lines of ctxd://SESSION/SEQ: one message of history, as stored.
function M.message_lines(session_id, seq)
  local page, err = ctxd().request_sync('session/history', { sessionId = session_id, from = seq, limit = 1 })
  if err then
    return { 'ctxd: ' .. ctxd().error_text(err) }
  end
  local entry = page and page.messages and page.messages[1]
  if not entry or entry.seq ~= seq then
    return { string.format('ctxd: session %s has no message #%d', session_id, seq) }
  end
  local m = entry.message
  local lines = {
    string.format('# %s #%d %s%s', session_id, seq, m.role, m.name and (' ' .. m.name) or ''),
    string.format('<!-- %s, %d tokens, %s -->', entry.createdAt, entry.tokens, entry.status),
    '',
  }
  append(lines, M.content_lines(m))
  return lines
end

--- ctxd://SESSION/SEQ buffers fill themselves when opened (from the quickfix list of
--- :CtxdSearch, from :CtxdHistory, or typed): BufReadCmd fetches the message.
function M.buffers(group)
  vim.api.nvim_create_autocmd('BufReadCmd', {
    group = group,
    pattern = 'ctxd://*',
    callback = function(args)
      local session_id, seq = args.match:match('^ctxd://(.+)/(%d+)$')
      if not session_id then
        return -- a prompt or history buffer: filled by its command
      end
      local buf = args.buf
      vim.api.nvim_buf_set_option(buf, 'modifiable', true)
      vim.api.nvim_buf_set_lines(buf, 0, -1, false, M.message_lines(session_id, tonumber(seq)))
      M.scratch_options(buf, 'markdown')
    end,
  })
end

-- --- the commands -------------------------------------------------------------------------

function M.sessions()
  local result = call('session/list', { limit = 200 })
  if not result then
    return
  end
  if #result.sessions == 0 then
    info('no sessions yet')
    return
  end
  vim.ui.select(result.sessions, {
    prompt = 'ctxd session',
    format_item = function(s)
      return string.format('%s  %s  %d msgs  %s/%s tokens%s', s.sessionId, s.model or '-', s.messageCount,
        ctxd().human(s.contextTokens), ctxd().human(s.contextWindow), s.title and ('  ' .. s.title) or '')
    end,
  }, function(choice)
    if choice then
      ctxd().use(choice.sessionId)
    end
  end)
end

function M.search(query)
  if query == nil or query:match('^%s*$') then
    fail('usage: :CtxdSearch {query}')
    return
  end
  local result = call('session/search', { query = query, limit = 200 })
  if not result then
    return
  end
  local items = {}
  for _, hit in ipairs(result.hits) do
    table.insert(items, {
      filename = string.format('ctxd://%s/%d', hit.sessionId, hit.seq),
      lnum = 1,
      text = string.format('[%s #%d %s] %s', hit.sessionId, hit.seq, hit.role, (hit.snippet:gsub('%s+', ' '))),
    })
  end
  vim.fn.setqflist({}, ' ', { title = 'ctxd search: ' .. query, items = items })
  if #items == 0 then
    info('no message matches ' .. query)
    return
  end
  vim.cmd('copen')
end

local FORMATS = { openai = true, anthropic = true, ollama = true }

function M.prompt(format)
  local id = active()
  if not id then
    return
  end
  format = (format ~= nil and format ~= '') and format or ctxd().config.format
  if not FORMATS[format] then
    fail(string.format('unknown format %q: openai, anthropic or ollama', format))
    return
  end
  -- A look, not a request: ctxd neither bills it nor pairs the next reply's usage with it.
  local p = call('context/prompt', { sessionId = id, format = format, preview = true })
  if not p then
    return
  end
  local b = p.budget or {}
  local lines = {
    string.format('<!-- ctxd prompt of %s (%s): %d tokens of %s, %d messages, %d compressions -->', id, format,
      p.tokens, tostring(b.maxPromptTokens), #p.messages, p.compressionCount or 0),
  }
  if p.system and p.system ~= vim.NIL then
    table.insert(lines, '')
    table.insert(lines, '## system')
    if type(p.system) == 'string' then
      append(lines, split(p.system))
    else
      append(lines, M.content_lines({ content = p.system }))
    end
  end
  for _, m in ipairs(p.messages) do
    table.insert(lines, '')
    table.insert(lines, '## ' .. (m.role or '?') .. (m.name and (' ' .. m.name) or ''))
    append(lines, M.content_lines(m))
  end
  scratch(string.format('ctxd://%s/prompt.%s', id, format), lines, 'markdown')
end

function M.compress(focus)
  local id = active()
  if not id then
    return
  end
  local params = { sessionId = id }
  if focus and focus ~= '' then
    params.focus = focus
  end
  local r = call('context/compress', params)
  if not r then
    return
  end
  if r.compressed then
    info(string.format('%s: %s -> %s tokens (%s)', id, ctxd().human(r.beforeTokens), ctxd().human(r.afterTokens),
      table.concat(r.layers, ', ')))
  else
    info(string.format('%s: nothing compressed%s', id, r.reason and (': ' .. r.reason) or ''))
  end
end

function M.snapshot(label)
  local id = active()
  if not id then
    return
  end
  local params = { sessionId = id }
  if label and label ~= '' then
    params.label = label
  end
  local s = call('snapshot/create', params)
  if s then
    info(string.format('snapshot %s of %s: %d messages, %s tokens in context', s.snapshotId, id, s.messageCount,
      ctxd().human(s.contextTokens)))
  end
end

local function restore(id, snapshot_id)
  local r = call('snapshot/restore', { sessionId = id, snapshotId = snapshot_id })
  if r then
    info(string.format('%s restored to %s (the context before is snapshot %s)', id, snapshot_id, r.backupSnapshotId))
  end
end

function M.restore(snapshot_id, bang)
  local id = active()
  if not id then
    return
  end
  if snapshot_id and snapshot_id ~= '' then
    if bang or vim.fn.confirm('Restore ' .. id .. ' to ' .. snapshot_id .. '?', '&Yes\n&No', 2) == 1 then
      restore(id, snapshot_id)
    end
    return
  end
  local list = call('snapshot/list', { sessionId = id })
  if not list then
    return
  end
  if #list.snapshots == 0 then
    info(id .. ' has no snapshots (:CtxdSnapshot makes one)')
    return
  end
  vim.ui.select(list.snapshots, {
    prompt = 'restore ' .. id .. ' to',
    format_item = function(s)
      return string.format('%s  %s  %s  %d msgs  %s tokens%s', s.snapshotId, s.createdAt, s.trigger, s.messageCount,
        ctxd().human(s.contextTokens), (s.label and s.label ~= vim.NIL) and ('  ' .. s.label) or '')
    end,
  }, function(choice)
    if choice and (bang or vim.fn.confirm('Restore ' .. id .. ' to ' .. choice.snapshotId .. '?', '&Yes\n&No', 2) == 1) then
      restore(id, choice.snapshotId)
    end
  end)
end

function M.goal(description)
  local id = active()
  if not id then
    return
  end
  if description and description ~= '' then
    local r = call('goal/set', { sessionId = id, description = description })
    if r then
      info(string.format('goal of %s: %s (%d tokens)', id, r.goal.description, r.tokens))
    end
    return
  end
  local r = call('goal/get', { sessionId = id })
  if not r then
    return
  end
  if not r.goal then
    info(id .. ' has no goal (:CtxdGoal {description} sets one)')
    return
  end
  local g = r.goal
  local lines = { string.format('# goal of %s (%s, %s)', id, g.status or 'active', g.priority or 'medium'), '' }
  append(lines, split(g.description))
  for _, d in ipairs(g.decisions or {}) do
    table.insert(lines, '- decision: ' .. (d.text or d.description or vim.inspect(d)))
  end
  for _, step in ipairs(g.nextSteps or {}) do
    table.insert(lines, '- next: ' .. step)
  end
  scratch(string.format('ctxd://%s/goal', id), lines, 'markdown')
end

function M.history()
  local id = active()
  if not id then
    return
  end
  local lines = { string.format('# history of %s  (<CR> opens a message)', id) }
  local from = nil
  repeat
    local page = call('session/history', { sessionId = id, from = from, limit = 1000 })
    if not page then
      return
    end
    for _, e in ipairs(page.messages) do
      local first = M.content_lines(e.message)[1] or ''
      table.insert(lines, string.format('%6d  %-9s %-11s %s', e.seq, e.message.role, e.status, first))
    end
    from = page.nextSeq
  until from == nil or #lines > 20000
  local buf = scratch(string.format('ctxd://%s/history', id), lines, 'ctxdhistory')
  vim.keymap.set('n', '<CR>', function()
    local seq = vim.api.nvim_get_current_line():match('^%s*(%d+)')
    if seq then
      vim.cmd('edit ' .. vim.fn.fnameescape(string.format('ctxd://%s/%s', id, seq)))
    end
  end, { buffer = buf, desc = 'ctxd: open this message' })
end

local function money(usd)
  if usd == nil or usd == vim.NIL then
    return ''
  end
  return string.format(usd < 1 and ' ($%.4f)' or ' ($%.2f)', usd)
end

local function input_bill(b)
  b = b or {}
  return string.format('uncached %s, written %s, read %s: %s billed%s', ctxd().human(b.uncached or 0),
    ctxd().human(b.cacheWrite or 0), ctxd().human(b.cacheRead or 0), ctxd().human(math.floor((b.billed or 0) + 0.5)),
    money(b.usd))
end

--- The bill lines of context/stats' ``bill`` (what the requests cost, against going direct).
function M.bill_lines(id, bill)
  local lines = { string.format("# what %s's requests were billed (input tokens, as %s counts them)", id,
    bill.provider) }
  table.insert(lines, string.format('provider      %s (%s)', bill.provider, bill.cache))
  table.insert(lines, string.format("requests      %d (%d from the provider's usage, the rest estimated)",
    bill.requests or 0, bill.measured or 0))
  if (bill.requests or 0) > 0 then
    table.insert(lines, 'through ctxd  ' .. input_bill(bill.ctxd))
    table.insert(lines, 'direct        ' .. input_bill(bill.direct))
    if bill.ratio ~= nil and bill.ratio ~= vim.NIL then
      table.insert(lines, string.format('ratio         %.2fx direct', bill.ratio))
    end
    table.insert(lines, string.format('passes        %d, which billed %s again of what was cached', bill.passes or 0,
      ctxd().human(math.floor((bill.passCost or 0) + 0.5))))
    -- Both sides are ctxd's estimates, so that they compare; what the provider's usage
    -- said of the same requests goes beside them.
    if bill.reported and bill.reported ~= vim.NIL then
      table.insert(lines, string.format('reported      %s for %d requests ctxd estimated at %s', input_bill(bill.reported),
        bill.measured or 0, ctxd().human(math.floor((bill.reportedEstimate or 0) + 0.5))))
    end
    local last = bill.lastRequest
    if last and last ~= vim.NIL then
      table.insert(lines, 'last request  ' .. input_bill(last.ctxd) .. ' (estimated)')
      if last.reported and last.reported ~= vim.NIL then
        table.insert(lines, "  provider's   " .. input_bill(last.reported))
      end
    end
  end
  if bill.budgetNote and bill.budgetNote ~= vim.NIL then
    table.insert(lines, 'budget        ' .. bill.budgetNote)
  end
  return lines
end

function M.bill()
  local id = active()
  if not id then
    return
  end
  local stats = call('context/stats', { sessionId = id })
  if not stats then
    return
  end
  if not stats.bill or stats.bill == vim.NIL then
    info(id .. ': this daemon does not report bills')
    return
  end
  scratch(string.format('ctxd://%s/bill', id), M.bill_lines(id, stats.bill), 'markdown')
end

function M.define()
  local cmd = vim.api.nvim_create_user_command
  cmd('CtxdSessions', function()
    M.sessions()
  end, { desc = 'ctxd: pick the active session' })
  cmd('CtxdSearch', function(o)
    M.search(o.args)
  end, { nargs = '+', desc = 'ctxd: search every session (quickfix list)' })
  cmd('CtxdPrompt', function(o)
    M.prompt(o.args)
  end, {
    nargs = '?',
    complete = function()
      return { 'openai', 'anthropic', 'ollama' }
    end,
    desc = 'ctxd: the active session\'s prompt, in a scratch buffer',
  })
  cmd('CtxdCompress', function(o)
    M.compress(o.args)
  end, { nargs = '?', desc = 'ctxd: compress the active session now ([focus])' })
  cmd('CtxdSnapshot', function(o)
    M.snapshot(o.args)
  end, { nargs = '?', desc = 'ctxd: snapshot the active session ([label])' })
  cmd('CtxdRestore', function(o)
    M.restore(o.args, o.bang)
  end, { nargs = '?', bang = true, desc = 'ctxd: restore a snapshot (! skips the confirmation)' })
  cmd('CtxdGoal', function(o)
    M.goal(o.args)
  end, { nargs = '?', desc = 'ctxd: show the goal, or set it' })
  cmd('CtxdHistory', function()
    M.history()
  end, { desc = 'ctxd: the active session\'s history' })
  cmd('CtxdBill', function()
    M.bill()
  end, { desc = 'ctxd: what the active session\'s requests were billed, against going direct' })
end

return M
