-- ctxd.nvim: the :Ctxd* commands exist from startup; nothing connects until one is used
-- (or setup{session = ...} names a session). See clients/nvim/README.md.
if vim.g.loaded_ctxd then
  return
end
vim.g.loaded_ctxd = true
if vim.fn.has('nvim-0.7') ~= 1 then
  vim.notify('ctxd.nvim needs Neovim 0.7 or later', vim.log.levels.WARN)
  return
end
require('ctxd.commands').define()
