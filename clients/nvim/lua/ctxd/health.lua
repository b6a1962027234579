-- :checkhealth ctxd — is ctxd installed, which version, does the daemon answer.

local M = {}

-- 0.7 has require('health').report_*; 0.8 vim.health.report_*; 0.10 vim.health.start/ok/...
local function reporter()
  local h = vim.health or require('health')
  return {
    start = h.start or h.report_start,
    ok = h.ok or h.report_ok,
    info = h.info or h.report_info,
    warn = h.warn or h.report_warn,
    error = h.error or h.report_error,
  }
end

--- The forwarder command up to its --remote flag, plus --version (`ctxd --version`,
--- `python -m ctxd --version`).
local function version_cmd(cmd)
  local out = {}
  for _, arg in ipairs(cmd) do
    if arg == '--remote' or arg:match('^%-%-remote=') then
      break
    end
    table.insert(out, arg)
  end
  table.insert(out, '--version')
  return out
end

function M.check()
  local report = reporter()
  local ctxd = require('ctxd')
  local cmd = ctxd.config.cmd
  report.start('ctxd')
  if vim.fn.has('nvim-0.7') ~= 1 then
    report.error('Neovim 0.7 or later is needed')
  end
  local path = vim.fn.exepath(cmd[1])
  if path == '' then
    report.error(string.format('%s not found (cmd = %s)', cmd[1], table.concat(cmd, ' ')), {
      'Install ctxd: pip install ctxd (or pip install -e . in its repository), in a venv on PATH',
      "Or name it: require('ctxd').setup({ cmd = { '/path/to/venv/bin/ctxd', '--remote', 'auto' } })",
    })
    return
  end
  report.ok(string.format('ctxd found: %s (cmd = %s)', path, table.concat(cmd, ' ')))
  local version = vim.fn.system(version_cmd(cmd))
  if vim.v.shell_error ~= 0 then
    report.error('`' .. table.concat(version_cmd(cmd), ' ') .. '` failed: ' .. vim.trim(version))
    return
  end
  report.ok('version: ' .. vim.trim(version))
  local status, err = ctxd.request_sync('daemon/status', nil, 20000)
  if err then
    report.error('the daemon does not answer: ' .. ctxd.error_text(err), {
      'Run the forwarder by hand to see why: ' .. table.concat(cmd, ' ') .. ' </dev/null',
      'ctxd-cli daemon status shows the shared daemon',
    })
    return
  end
  report.ok(string.format('daemon reachable: pid %d, ctxd %s, %d sessions, %d connections, data in %s',
    status.pid, status.version, status.sessions, status.connections, status.dataDir))
  local info = ctxd.info()
  report.info(string.format('this Neovim: forwarder pid %s, active session %s', tostring(info.pid),
    info.session or '(none: :CtxdSessions)'))
end

return M
