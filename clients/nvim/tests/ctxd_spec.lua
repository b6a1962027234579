-- ctxd.nvim against a real daemon: the commands, the statusline, the quickfix list, the API.
-- Run by run.lua; the tests run in order and share the daemon's sessions.

return function(T)
  local ctxd = require('ctxd')
  local S = 'nv-main'

  local function words(n, seed)
    local out = {}
    for i = 1, n do
      table.insert(out, string.format('word%d-%d', seed, i % 37))
    end
    return table.concat(out, ' ')
  end

  local function push_sync(messages)
    local done, err, result = false, nil, nil
    ctxd.push(S, messages, function(e, r)
      done, err, result = true, e, r
    end)
    T.wait_for(function()
      return done
    end, 'the push to be answered')
    T.ok(not err, 'push failed: ' .. vim.inspect(err))
    return result
  end

  return {
    { 'setup names the forwarder; nothing connects before the first use', function()
      ctxd.setup({ cmd = T.cmd })
      T.eq(false, ctxd.info().running, 'running before any command')
      T.eq('', ctxd.statusline(), 'statusline without a session')
    end },

    { 'a command without a session says how to pick one', function()
      vim.cmd('CtxdPrompt')
      T.ok(T.note_matching('no session selected: pick one with :CtxdSessions'), 'the error')
    end },

    { ':CtxdSessions offers every session and makes the pick active', function()
      T.call('session/create', { sessionId = 'nv-other', model = 'gpt-4' })
      T.call('session/create', { sessionId = S, model = 'gpt-4', contextWindow = 8192 })
      T.answer_select(function(items)
        for _, item in ipairs(items) do
          if item.sessionId == S then
            return item
          end
        end
      end)
      vim.cmd('CtxdSessions')
      local offered = {}
      for _, item in ipairs(T.offered.items) do
        offered[item.sessionId] = T.offered.opts.format_item(item)
      end
      T.ok(offered['nv-other'] and offered[S], 'both sessions offered: ' .. vim.inspect(offered))
      T.matches('^nv%-main  gpt%-4  0 msgs', offered[S], 'how a session is shown')
      T.eq(S, ctxd.session(), 'the active session')
      T.wait_for(function()
        return ctxd.status().maxPromptTokens
      end, 'the budget of the picked session')
      T.matches('^ctxd nv%-main %d+/%d[%d.]*k 0%%$', ctxd.statusline(), 'statusline of an empty session')
    end },

    { 'the statusline follows a push (session/updated)', function()
      local before = ctxd.status().contextTokens
      local pushed = push_sync({
        { role = 'user', content = 'Find the zebrafish config loader and explain it.' },
        { role = 'assistant', content = 'The zebrafish loader reads TOML, then the environment.' },
      })
      T.eq(2, pushed.messageCount, 'messages stored')
      T.wait_for(function()
        return ctxd.status().messageCount == 2
      end, 'session/updated to reach the statusline')
      local s = ctxd.status()
      T.ok(s.contextTokens > before, 'context tokens grew')
      local max = ctxd.human(s.maxPromptTokens)
      T.eq(string.format('ctxd nv-main %d/%s %d%%', s.contextTokens, max,
        math.floor(100 * s.contextTokens / s.maxPromptTokens + 0.5)), ctxd.statusline(), 'statusline')
    end },

    { 'on_notification hands notifications to AI plugins, and can be removed', function()
      local seen = {}
      local remove = ctxd.on_notification(function(method, params)
        table.insert(seen, { method = method, params = params })
      end)
      push_sync({ { role = 'user', content = 'one more' } })
      T.wait_for(function()
        for _, n in ipairs(seen) do
          if n.method == 'session/updated' and n.params.messageCount == 3 then
            return true
          end
        end
      end, 'session/updated with 3 messages')
      remove()
      local count = #seen
      push_sync({ { role = 'assistant', content = 'noted' } })
      T.wait_for(function()
        return ctxd.status().messageCount == 4
      end, 'the fourth message')
      T.eq(count, #seen, 'nothing delivered after remove()')
    end },

    { 'the API: prompt and stats', function()
      local got
      ctxd.prompt(S, 'anthropic', function(err, p)
        got = { err = err, p = p }
      end)
      T.wait_for(function()
        return got
      end, 'the prompt')
      T.ok(not got.err, vim.inspect(got.err))
      T.eq('anthropic', got.p.format, 'format')
      T.eq(4, #got.p.messages, 'messages in the prompt')
      local stats
      ctxd.stats(S, function(err, st)
        stats = st
      end)
      T.wait_for(function()
        return stats
      end, 'the stats')
      T.eq(4, stats.messageCount, 'messageCount')
    end },

    { 'the statusline after a compression (:CtxdCompress, context/compressed)', function()
      local messages = {}
      for i = 1, 14 do -- below the automatic trigger: the compression is the command's
        table.insert(messages, { role = i % 2 == 1 and 'user' or 'assistant', content = words(40, i) })
      end
      push_sync(messages)
      T.eq(0, ctxd.status().compressions, 'no automatic compression yet')
      T.forget_notes()
      vim.cmd('CtxdCompress')
      T.ok(T.note_matching('^ctxd: nv%-main: .+ %-> .+ tokens'), 'the result: ' .. vim.inspect(T.notes()))
      T.wait_for(function()
        return ctxd.status().compressions == 1
      end, 'context/compressed to reach the statusline')
      local s = ctxd.status()
      T.eq(string.format('ctxd nv-main %s/%s %d%% c%d', ctxd.human(s.contextTokens), ctxd.human(s.maxPromptTokens),
        math.floor(100 * s.contextTokens / s.maxPromptTokens + 0.5), s.compressions), ctxd.statusline(),
        'statusline after a compression')
      T.ok(T.note_matching('nv%-main compressed: '), 'the compression was announced')
    end },

    { ':CtxdSearch fills the quickfix list; a hit opens the message in a scratch buffer', function()
      local qf
      T.wait_for(function() -- the daemon indexes in the background
        vim.cmd('CtxdSearch zebrafish')
        qf = vim.fn.getqflist({ title = 1, items = 1 })
        return #qf.items >= 2
      end, 'the search index to have the zebrafish messages')
      T.eq('ctxd search: zebrafish', qf.title, 'quickfix title')
      local first = qf.items[1]
      T.matches('^%[nv%-main #%d %a+%] .*%[zebrafish%]', first.text, 'quickfix text')
      vim.cmd('cfirst')
      local name = vim.api.nvim_buf_get_name(0)
      T.matches('^ctxd://nv%-main/[12]$', name, 'the buffer a hit opens')
      T.eq('nofile', vim.bo.buftype, 'scratch buffer')
      T.eq(false, vim.bo.modifiable, 'read-only')
      local text = T.buffer_text()
      T.matches('^# nv%-main #[12] %a+\n', text, 'header')
      T.matches('zebrafish', text, 'the message')
    end },

    { ':CtxdPrompt [format] shows the prompt in a scratch buffer', function()
      local handed_out = T.call('context/stats', { sessionId = S }).promptCache.prompts
      vim.cmd('CtxdPrompt ollama')
      T.eq(handed_out, T.call('context/stats', { sessionId = S }).promptCache.prompts,
        'a preview: not counted as a prompt handed out (nor billed)')
      T.eq('ctxd://nv-main/prompt.ollama', vim.api.nvim_buf_get_name(0), 'buffer name')
      T.eq('nofile', vim.bo.buftype, 'scratch')
      local text = T.buffer_text()
      T.matches('^<!%-%- ctxd prompt of nv%-main %(ollama%): %d+ tokens of %d+', text, 'header')
      T.matches('\n## user\n## Earlier conversation, compressed by ctxd\n', text,
        'the checkpoint is a message of its own in the conversation after the compression')
      T.matches('\n## user\n', text, 'a user message')
      vim.cmd('CtxdPrompt klingon')
      T.ok(T.note_matching('unknown format "klingon": openai, anthropic or ollama'), 'bad format')
    end },

    { ':CtxdBill shows what the requests were billed, against going direct', function()
      -- A request: a prompt handed out (:CtxdPrompt's preview is none), then the reply
      -- with the provider's usage.
      T.call('context/prompt', { sessionId = S })
      push_sync({ { role = 'assistant', content = 'done', usage = { inputTokens = 1500, cachedInputTokens = 1024 } } })
      vim.cmd('CtxdBill')
      T.eq('ctxd://nv-main/bill', vim.api.nvim_buf_get_name(0), 'buffer name')
      local text = T.buffer_text()
      T.matches('provider +openai %(automatic%)', text, 'gpt-4 bills as OpenAI')
      T.matches('requests +%d+ %(1 from the provider\'s usage', text, 'the reply\'s usage counted')
      T.matches('\nthrough ctxd +uncached [%d.k]+, written 0, read [%d.k]+: ', text, 'the session through ctxd')
      T.matches('\ndirect +uncached ', text, 'direct')
      T.matches('\nlast request +uncached [%d.k]+, written 0, read [%d.k]+: .+%(estimated%)', text, 'ctxd\'s estimate')
      T.matches("\n  provider's +uncached 476, written 0, read 1%.0k: ", text, 'the reported split beside it')
      T.matches('\nreported +uncached 476, written 0, read 1%.0k: .+ for 1 requests ctxd estimated at ', text,
        'the session\'s reported requests')
      T.ok(not text:find('\nbudget ', 1, true), 'no budget note: 8,192 is gpt-4\'s own window')
    end },

    { ':CtxdGoal sets and shows the goal', function()
      vim.cmd('CtxdGoal Ship the loader fix')
      T.ok(T.note_matching('goal of nv%-main: Ship the loader fix'), 'set')
      T.eq('Ship the loader fix', T.call('goal/get', { sessionId = S }).goal.description, 'stored')
      vim.cmd('CtxdGoal')
      T.eq('ctxd://nv-main/goal', vim.api.nvim_buf_get_name(0), 'goal buffer')
      T.matches('Ship the loader fix', T.buffer_text(), 'goal text')
    end },

    { ':CtxdSnapshot and :CtxdRestore! roll the context back', function()
      vim.cmd('CtxdSnapshot before-detour')
      T.ok(T.note_matching('^ctxd: snapshot %S+ of nv%-main: %d+ messages'), 'snapshot made')
      push_sync({ { role = 'user', content = 'a detour we will roll back' } })
      local last = ctxd.status().messageCount
      T.answer_select(function(items)
        for _, item in ipairs(items) do
          if item.label == 'before-detour' then
            return item
          end
        end
      end)
      vim.cmd('CtxdRestore!')
      T.ok(T.offered, 'snapshots offered')
      T.ok(T.note_matching('^ctxd: nv%-main restored to '), 'restored: ' .. vim.inspect(T.notes()))
      local page = T.call('session/history', { sessionId = S, from = last, limit = 1 })
      T.eq('rolled_back', page.messages[1].status, 'the detour is rolled back')
    end },

    { ':CtxdHistory lists the history; <CR> opens a message', function()
      vim.cmd('CtxdHistory')
      T.eq('ctxd://nv-main/history', vim.api.nvim_buf_get_name(0), 'history buffer')
      local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
      T.matches('^%s+1  user%s+%S+%s+Find the zebrafish', lines[2], 'first message')
      T.eq(1 + 20, #lines, 'a header and every message, the rolled back one too (and :CtxdBill\'s reply)')
      vim.api.nvim_win_set_cursor(0, { 3, 0 })
      vim.cmd('execute "normal \\<CR>"')
      T.eq('ctxd://nv-main/2', vim.api.nvim_buf_get_name(0), 'opened')
      T.matches('The zebrafish loader reads TOML', T.buffer_text(), 'its text')
    end },

    { ':checkhealth ctxd finds ctxd, its version and the daemon', function()
      vim.cmd('checkhealth ctxd')
      local text = T.buffer_text()
      T.matches('OK:? ctxd found: ', text, 'found')
      T.matches('OK:? version: ctxd %d', text, 'version')
      T.matches('OK:? daemon reachable: pid %d+', text, 'daemon')
      vim.cmd('bwipeout!')
    end },

    { 'one connection, and a clear error when ctxd is missing', function()
      local pid = ctxd.info().pid
      T.ok(pid, 'connected')
      T.call('session/list', nil)
      T.eq(pid, ctxd.info().pid, 'the same forwarder for every request')
      ctxd.stop()
      T.eq(false, ctxd.info().running, 'stopped')
      ctxd.setup({ cmd = { '/nonexistent/ctxd', '--remote', 'auto' } })
      local _, err = ctxd.request_sync('session/list', {})
      T.matches('/nonexistent/ctxd is not an executable on PATH %(install ctxd', err and err.message, 'error')
      vim.cmd('checkhealth ctxd')
      T.matches('ERROR:? /nonexistent/ctxd not found', T.buffer_text(), 'health')
      vim.cmd('bwipeout!')
      ctxd.setup({ cmd = T.cmd, session = S })
      T.wait_for(function()
        return ctxd.status().connected and ctxd.status().maxPromptTokens
      end, 'a new connection after setup{session}')
      T.ok(ctxd.info().pid ~= pid, 'a new forwarder')
    end },
  }
end
