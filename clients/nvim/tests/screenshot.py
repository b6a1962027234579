"""Take the README's screenshot of ctxd.nvim: a real Neovim in a pseudo-terminal, its
screen read by a terminal emulator (pyte) and drawn to a PNG (Pillow). Nothing is mocked
or drawn by hand: a daemon in a temp dir gets a small conversation, Neovim runs the
plugin against it, and what the terminal shows is what the picture shows.

    python3 -m venv /tmp/shot && /tmp/shot/bin/pip install pyte pillow
    /tmp/shot/bin/python clients/nvim/tests/screenshot.py --ctxd-python .venv/bin/python \\
        --out clients/nvim/screenshot.png
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pyte
from PIL import Image, ImageDraw, ImageFont

PLUGIN = Path(__file__).resolve().parents[1]
COLS, ROWS = 112, 34
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
BG, FG = (30, 30, 36), (220, 220, 214)
NAMED = {"black": (40, 40, 48), "red": (224, 108, 117), "green": (152, 195, 121), "brown": (229, 192, 123),
         "yellow": (229, 192, 123), "blue": (97, 175, 239), "magenta": (198, 120, 221), "cyan": (86, 182, 194),
         "white": (220, 220, 214), "brightblack": (92, 99, 112), "brightred": (240, 128, 128),
         "brightgreen": (170, 220, 140), "brightyellow": (240, 210, 140), "brightbrown": (240, 210, 140),
         "brightblue": (120, 190, 250),
         "brightmagenta": (215, 150, 235), "brightcyan": (110, 200, 210), "brightwhite": (250, 250, 250)}


def frame(message: dict[str, object]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


class Raw:
    """A minimal blocking client on the daemon's socket, to set the scene up."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(path))
        self.buf = b""
        self.ids = 0

    def call(self, method: str, params: object = None) -> object:
        self.ids += 1
        message: dict[str, object] = {"jsonrpc": "2.0", "id": self.ids, "method": method}
        if params is not None:
            message["params"] = params
        self.sock.sendall(frame(message))
        while True:
            while b"\r\n\r\n" not in self.buf:
                self.buf += self.sock.recv(65536)
            header, _, rest = self.buf.partition(b"\r\n\r\n")
            length = int(header.split(b":")[1])
            while len(rest) < length:
                rest += self.sock.recv(65536)
            body, self.buf = rest[:length], rest[length:]
            reply = json.loads(body)
            if reply.get("id") == self.ids:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result")


def scene(path: Path) -> None:
    c = Raw(path)
    c.call("initialize", {"processId": None})
    c.call("session/create", {"sessionId": "loader-fix", "model": "gpt-4o-mini", "contextWindow": 6000,
                              "title": "Fix the TOML config loader"})
    c.call("session/create", {"sessionId": "release-notes", "model": "claude-sonnet-4", "title": "Draft 0.2 notes"})
    c.call("goal/set", {"sessionId": "loader-fix", "description": "Make the config loader accept env overrides"})
    turns = []
    for i in range(9):
        turns += [
            {"role": "user", "content": f"Step {i + 1}: the loader still ignores CTXD_STORAGE_DURABILITY; "
                                        "look at config.py and the env parsing, then run the tests."},
            {"role": "assistant", "content": None, "toolCalls": [{"id": f"c{i}", "type": "function", "function": {
                "name": "run_tests", "arguments": json.dumps({"path": "tests/unit/test_config.py"})}}]},
            {"role": "tool", "toolCallId": f"c{i}", "content": "FAILED test_env_override - KeyError: 'storage'\n"
                                                             + "ok " * 120},
            {"role": "assistant", "content": f"The loader reads the TOML file before the environment (pass {i + 1}); "
                                             "env keys are upper-cased, so the section lookup misses. Fixing."},
        ]
    c.call("session/push", {"sessionId": "loader-fix", "messages": turns})
    c.call("context/compress", {"sessionId": "loader-fix"})
    c.call("session/push", {"sessionId": "release-notes", "messages": [
        {"role": "user", "content": "Summarise the loader fix for the release notes."}]})


INIT = """
vim.opt.runtimepath:prepend({plugin!r})
vim.cmd('runtime plugin/ctxd.lua')
vim.o.laststatus = 2
vim.o.showmode = false
vim.o.number = false
vim.o.statusline = " %f %m%=%{{v:lua.require'ctxd'.statusline()}}  "
vim.cmd('autocmd FileType markdown highlight link markdownError NONE') -- Vim's markdown marks a_b red
require('ctxd').setup({{ cmd = vim.json.decode({cmd!r}), session = 'loader-fix', notify = false }})
vim.defer_fn(function()
  vim.cmd('CtxdSearch loader')
  vim.cmd('wincmd k')
  vim.cmd('CtxdPrompt openai')
  vim.cmd('normal! gg')
  vim.cmd('redraw!')
  vim.api.nvim_echo({{{{':CtxdSearch loader', 'Normal'}}}}, false, {{}})
end, 1500)
"""


def color(value: str, default: tuple[int, int, int]) -> tuple[int, int, int]:
    if value == "default":
        return default
    if value in NAMED:
        return NAMED[value]
    if len(value) == 6:
        try:
            return tuple(int(value[i:i + 2], 16) for i in (0, 2, 4))  # type: ignore[return-value]
        except ValueError:
            pass
    return default


def render(screen: pyte.Screen, out: Path) -> None:
    font = ImageFont.truetype(FONT, 15)
    bold = ImageFont.truetype(FONT.replace(".ttf", "-Bold.ttf"), 15)
    left, top, right, bottom = font.getbbox("M")
    cw, ch = right - left + 0.2, 19
    pad = 12
    img = Image.new("RGB", (int(COLS * cw) + 2 * pad, ROWS * ch + 2 * pad), BG)
    draw = ImageDraw.Draw(img)
    for y in range(ROWS):
        line = screen.buffer[y]
        for x in range(COLS):
            cell = line[x]
            fg, bg = color(cell.fg, FG), color(cell.bg, BG)
            if cell.reverse:
                fg, bg = bg if cell.bg != "default" else BG, fg
            x0, y0 = pad + x * cw, pad + y * ch
            if bg != BG:
                draw.rectangle([x0, y0, x0 + cw + 0.5, y0 + ch], fill=bg)
            if cell.data.strip():
                draw.text((x0, y0 + 1), cell.data, font=bold if cell.bold else font, fill=fg)
    img.save(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ctxd-python", default="python3", help="a Python that has ctxd installed")
    p.add_argument("--out", default=str(PLUGIN / "screenshot.png"))
    p.add_argument("--text", help="also write the screen as text to this file")
    args = p.parse_args()
    nvim = shutil.which("nvim")
    if nvim is None:
        raise SystemExit("nvim is not on PATH")
    tmp = Path(tempfile.mkdtemp(prefix="ctxd-shot-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXD_")}
    env.update(XDG_CONFIG_HOME=str(tmp / "config"), XDG_STATE_HOME=str(tmp / "state"),
               XDG_DATA_HOME=str(tmp / "data"), XDG_RUNTIME_DIR=str(tmp), HOME=str(tmp),
               TERM="xterm-256color", COLUMNS=str(COLS), LINES=str(ROWS))
    sock = tmp / "ctxd.sock"
    daemon = subprocess.Popen([args.ctxd_python, "-m", "ctxd", "--socket", str(sock), "--data-dir", str(tmp / "db")],
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=open(tmp / "daemon.log", "wb"))
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"the daemon did not start: {(tmp / 'daemon.log').read_text()}")
            time.sleep(0.1)
        time.sleep(0.3)
        scene(sock)
        cmd = json.dumps([args.ctxd_python, "-m", "ctxd", "--remote", f"unix:{sock}"])
        init = tmp / "init.lua"
        init.write_text(INIT.format(plugin=str(PLUGIN), cmd=cmd))
        screen = pyte.Screen(COLS, ROWS)
        stream = pyte.ByteStream(screen)
        pid, fd = pty.fork()
        if pid == 0:
            os.execvpe(nvim, [nvim, "--clean", "-u", str(init), "-i", "NONE", "-n"], env)
        import fcntl
        import struct
        import termios

        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        end = time.monotonic() + 8
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                stream.feed(data)
                # Answer the terminal queries Neovim sends, as a terminal would.
                if b"\x1b[c" in data or b"\x1b[0c" in data:
                    os.write(fd, b"\x1b[?62;c")
        os.write(fd, b"\x1b:qa!\r")
        time.sleep(0.5)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        render(screen, Path(args.out))
        if args.text:
            Path(args.text).write_text("\n".join(screen.display) + "\n")
        print(f"wrote {args.out}")
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
