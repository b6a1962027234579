-- A small test runner for ctxd.nvim: no plugin manager, no network.
--
--   CTXD_NVIM_CMD='["ctxd","--remote","unix:/tmp/x/ctxd.sock"]' \
--   CTXD_NVIM_RESULTS=/tmp/results.txt \
--   nvim --headless --clean -u NONE -c 'luafile clients/nvim/tests/run.lua'
--
-- Runs every *_spec.lua beside this file (or CTXD_NVIM_SPECS, comma-separated names), each
-- a list of { name, fn } run in order, against the daemon the forwarder command reaches
-- (tests/clients/test_nvim.py starts one in a temp dir). Writes a TAP-like report
-- ("1..N", "ok NAME", "not ok NAME" + the traceback) to CTXD_NVIM_RESULTS and exits with
-- the number of failures.

local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
local root = vim.fn.fnamemodify(here, ':h')
vim.opt.runtimepath:prepend(root)
vim.opt.swapfile = false
vim.cmd('runtime plugin/ctxd.lua')

local results_path = os.getenv('CTXD_NVIM_RESULTS') or 'ctxd-nvim-results.txt'

local function bail(message)
  local f = io.open(results_path, 'w')
  if f then
    f:write('Bail out! ' .. tostring(message):gsub('\n', '\n# ') .. '\n')
    f:close()
  end
  io.stderr:write('ctxd.nvim tests: ' .. tostring(message) .. '\n')
  vim.cmd('cquit 1')
end

local cmd_json = os.getenv('CTXD_NVIM_CMD')
if not cmd_json then
  bail('CTXD_NVIM_CMD is not set (the forwarder command, a JSON list)')
end
local cmd = vim.json.decode(cmd_json)

local T = {}
T.cmd = cmd

function T.eq(expected, actual, what)
  if not vim.deep_equal(expected, actual) then
    error(string.format('%s: expected %s, got %s', what or 'value', vim.inspect(expected), vim.inspect(actual)), 2)
  end
end

function T.ok(value, what)
  if not value then
    error((what or 'expected a true value') .. ', got ' .. vim.inspect(value), 2)
  end
  return value
end

function T.matches(pattern, text, what)
  if type(text) ~= 'string' or not text:find(pattern) then
    error(string.format('%s: %s does not match %q', what or 'text', vim.inspect(text), pattern), 2)
  end
end

--- Wait (processing events) until fn() returns a truthy value; fail after timeout ms.
function T.wait_for(fn, what, timeout)
  local value
  local ok = vim.wait(timeout or 20000, function()
    value = fn()
    return value
  end, 20)
  if not ok then
    error('timed out waiting for ' .. what, 2)
  end
  return value
end

--- A request that must succeed.
function T.call(method, params)
  local result, err = require('ctxd').request_sync(method, params, 30000)
  if err then
    error(method .. ' failed: ' .. require('ctxd').error_text(err), 2)
  end
  return result
end

--- Messages given to vim.notify since the last call.
local notes = {}
vim.notify = function(message, level)
  table.insert(notes, { message = message, level = level })
end
function T.notes()
  return vim.deepcopy(notes)
end

function T.forget_notes()
  notes = {}
end

function T.note_matching(pattern)
  for _, n in ipairs(notes) do
    if n.message:find(pattern) then
      return n
    end
  end
  return nil
end

--- vim.ui.select answered by choose(items, opts) (the user's pick), remembering what was offered.
function T.answer_select(choose)
  T.offered = nil
  vim.ui.select = function(items, opts, on_choice)
    T.offered = { items = items, opts = opts }
    on_choice(choose(items, opts))
  end
end

function T.buffer_text(buf)
  return table.concat(vim.api.nvim_buf_get_lines(buf or 0, 0, -1, false), '\n')
end

local specs = {}
local wanted = os.getenv('CTXD_NVIM_SPECS')
if wanted and wanted ~= '' then
  for name in wanted:gmatch('[^,]+') do
    table.insert(specs, here .. '/' .. name .. '_spec.lua')
  end
else
  specs = vim.fn.glob(here .. '/*_spec.lua', false, true)
  table.sort(specs)
end

local tests = {}
for _, path in ipairs(specs) do
  local loaded, spec = pcall(function()
    return dofile(path)(T)
  end)
  if not loaded then
    bail('cannot load ' .. path .. ': ' .. tostring(spec))
  end
  for _, t in ipairs(spec) do
    table.insert(tests, { name = vim.fn.fnamemodify(path, ':t:r') .. ': ' .. t[1], fn = t[2] })
  end
end
if #tests == 0 then
  bail('no tests found in ' .. here)
end

local lines = { '1..' .. #tests }
local failures = 0
for _, t in ipairs(tests) do
  T.forget_notes()
  local ok, err = xpcall(t.fn, debug.traceback)
  if ok then
    table.insert(lines, 'ok ' .. t.name)
  else
    failures = failures + 1
    table.insert(lines, 'not ok ' .. t.name)
    for line in tostring(err):gmatch('[^\n]+') do
      table.insert(lines, '#   ' .. line)
    end
  end
  local f = assert(io.open(results_path, 'w'))
  f:write(table.concat(lines, '\n') .. '\n')
  f:close()
end
vim.cmd((failures == 0 and 'qall!') or ('cquit ' .. failures))
