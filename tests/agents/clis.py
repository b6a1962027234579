"""The real agent CLIs: pinned, installed apart from the user's own, and launched offline
against a base URL as their users configure them.

Pins: ``tests/agents/clis/package.json`` and its ``package-lock.json`` (Claude Code,
Codex CLI, opencode, from npm) and :data:`AIDER` (aider, from PyPI, in a virtualenv of
its own: it pins many packages; installed with uv, pip if uv cannot be had).
``python3 tests/agents/clis.py install`` (what
``.ci/run`` runs; standard library only) installs them into :func:`home`, a cache
directory named after the pins (``CTXD_AGENT_CLIS`` says another): a second run with the
same pins finds them there and does nothing. npm runs with ``--ignore-scripts``: the
binaries are taken from the platform packages where the packages' install scripts
would copy them from. Where npm (or a CLI's package for this platform) is missing, the
CLI is not installed and :func:`missing` says why; the tests skip it with that reason.

Each CLI is launched by :func:`launch` with a private HOME (its own configuration,
sessions and caches there, never the user's), telemetry, update checks and other
non-essential traffic off, in the settings their documentation gives for a custom
endpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = HERE / "clis"
AIDER = "aider-chat==0.86.2"
UV = "uv==0.13.9"
CLIS = ("claude", "codex", "opencode", "aider")
MODELS = {"claude": "claude-sonnet-4-6", "codex": "gpt-5.5", "opencode": "gpt-4o", "aider": "gpt-4o"}
"""The model each CLI asks for (the fake upstream knows their windows)."""
API_KEY = "sk-fake-key-for-the-scripted-upstream"


def _pins_key() -> str:
    digest = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        digest.update((PACKAGES / name).read_bytes())
    digest.update(AIDER.encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}-{platform.machine()}".encode())
    return digest.hexdigest()[:12]


def home() -> Path:
    """Where the pinned CLIs are installed."""
    if os.environ.get("CTXD_AGENT_CLIS"):
        return Path(os.environ["CTXD_AGENT_CLIS"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ctxd-agent-clis" / _pins_key()


def _platform_suffix() -> str:
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(),
                                                                                       platform.machine())
    musl = os.path.exists("/lib/ld-musl-x86_64.so.1") or os.path.exists("/lib/ld-musl-aarch64.so.1")
    return f"linux-{machine}" + ("-musl" if musl else "")


def _opencode_binary(modules: Path) -> Path:
    suffix = _platform_suffix()
    try:
        avx2 = "avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        avx2 = False
    names = [f"opencode-{suffix}"] if avx2 else []
    names.append(f"opencode-{suffix.replace(suffix.split('-')[1], suffix.split('-')[1] + '-baseline', 1)}")
    names.append(f"opencode-{suffix}")
    for name in names:
        path = modules / name / "bin" / "opencode"
        if path.exists():
            return path
    return modules / names[0] / "bin" / "opencode"


def binary(cli: str) -> list[str]:
    """The command that starts ``cli`` (a list: Codex is its node launcher)."""
    modules = home() / "node_modules"
    if cli == "claude":
        return [str(modules / "@anthropic-ai" / f"claude-code-{_platform_suffix()}" / "claude")]
    if cli == "codex":
        node = shutil.which("node") or "node"
        return [node, str(modules / "@openai" / "codex" / "bin" / "codex.js")]
    if cli == "opencode":
        return [str(_opencode_binary(modules))]
    if cli == "aider":
        return [str(home() / "aider" / "bin" / "aider")]
    raise ValueError(f"unknown CLI {cli!r}: one of {', '.join(CLIS)}")


def missing(cli: str) -> str | None:
    """Why ``cli`` cannot run here, or None."""
    command = binary(cli)
    if cli == "codex":
        vendor = home() / "node_modules" / "@openai" / f"codex-{_platform_suffix()}"
        if shutil.which("node") is None:
            return "node is missing: Codex CLI cannot run"
        if not Path(command[1]).exists() or not vendor.exists():
            return f"Codex CLI is not installed in {home()} (python3 tests/agents/clis.py install)"
        return None
    if not Path(command[0]).exists():
        return f"{cli} is not installed in {home()} (python3 tests/agents/clis.py install)"
    return None


def version(cli: str) -> str:
    """What ``cli --version`` says (run with a throw-away HOME: nothing of it is kept)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run([*binary(cli), "--version"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, HOME=scratch, IS_SANDBOX="1"))
    text = (out.stdout.strip() or out.stderr.strip()).splitlines()
    return text[-1] if out.returncode == 0 and text else "?"


def install() -> int:
    """Install the pinned CLIs into :func:`home` (nothing to do when they are there). npm
    and pip download side by side."""
    target = home()
    target.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm")
    npm_run: subprocess.Popen[bytes] | None = None
    if (target / "npm.ok").exists():
        print(f"agent CLIs (npm): already in {target}")
    elif npm is None:
        print("npm is missing: Claude Code, Codex CLI and opencode are not installed; their tests are skipped")
    else:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(PACKAGES / name, target / name)
        # install, not ci: the lock lists only the platform packages npm resolved where it was
        # made (opencode publishes some platforms late), and ci refuses such a lock
        npm_run = subprocess.Popen([npm, "install", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                                   cwd=target)
    if (target / "aider.ok").exists():
        print(f"aider: already in {target / 'aider'}")
    else:
        _install_aider(target)
    if npm_run is not None:
        if npm_run.wait() == 0:
            (target / "npm.ok").write_text("")
            print(f"agent CLIs (npm): installed in {target}")
        else:
            print(f"npm install failed ({npm_run.returncode}): Claude Code, Codex CLI and opencode tests are skipped")
    return 0


def _uv(target: Path) -> Path | None:
    """uv (from PyPI, in a virtualenv of its own): installs aider's ~100 packages in ~20 s
    where pip takes 1-4 minutes. None if it cannot be had (pip is used then)."""
    tool = target / "uv"
    uv = tool / "bin" / "uv"
    if not uv.exists():
        try:
            venv.EnvBuilder(with_pip=True).create(tool)
        except Exception:
            return None
        done = subprocess.run([str(tool / "bin" / "python"), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", UV])
        if done.returncode != 0:
            return None
    return uv


def _install_aider(target: Path) -> None:
    shutil.rmtree(target / "aider", ignore_errors=True)
    try:
        venv.EnvBuilder(with_pip=True).create(target / "aider")
    except Exception as exc:  # no ensurepip (Debian's python3 without python3-venv)
        print(f"aider is not installed: no virtualenv ({exc}); its tests are skipped")
        return
    python = target / "aider" / "bin" / "python"
    uv = _uv(target)
    if uv is not None:
        command = [str(uv), "pip", "install", "-q", "--python", str(python), AIDER]
    else:
        command = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", AIDER]
    done = subprocess.run(command)
    if done.returncode == 0:
        (target / "aider.ok").write_text("")
        print(f"aider: installed in {target / 'aider'}")
    else:
        print(f"{' '.join(command[:3])} {AIDER} failed ({done.returncode}): the aider tests are skipped")


# --- launching ------------------------------------------------------------------------------

@dataclass
class Launch:
    """How to run a CLI on a task: its command, environment and the files it reads."""

    argv: list[str]
    env: dict[str, str]
    stdin: str = ""
    files: dict[Path, str] = field(default_factory=dict)


def _base_env(private_home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=str(private_home), XDG_CONFIG_HOME=str(private_home / ".config"),
               XDG_DATA_HOME=str(private_home / ".local" / "share"), XDG_CACHE_HOME=str(private_home / ".cache"),
               XDG_STATE_HOME=str(private_home / ".local" / "state"), TERM="dumb", NO_COLOR="1",
               GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    return env


def launch(cli: str, base_url: str, private_home: Path, repo: Path, prompt: str, stdin: str = "") -> Launch:
    """``cli`` on ``prompt`` in ``repo``, its API at ``base_url`` (the tap: direct or proxied alike)."""
    env = _base_env(private_home)
    model = MODELS[cli]
    if cli == "claude":
        env.update(IS_SANDBOX="1", ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY=API_KEY,
                   DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1",
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_BUG_COMMAND="1",
                   CLAUDE_CONFIG_DIR=str(private_home / ".claude"))
        return Launch([*binary(cli), "-p", prompt, "--model", model, "--dangerously-skip-permissions",
                       "--output-format", "text"], env)
    if cli == "codex":
        codex_home = private_home / ".codex"
        env.update(CODEX_HOME=str(codex_home), CTXD_AGENTS_KEY=API_KEY)
        config = "\n".join([
            f'model = "{model}"',
            'model_provider = "scripted"',
            "check_for_update_on_startup = false",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[model_providers.scripted]",
            'name = "Scripted upstream"',
            f'base_url = "{base_url}/v1"',
            'wire_api = "responses"',
            'env_key = "CTXD_AGENTS_KEY"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
            f'[projects."{repo}"]',
            'trust_level = "trusted"',
            "",
        ])
        return Launch([*binary(cli), "exec", "--dangerously-bypass-approvals-and-sandbox", "--color", "never",
                       prompt], env, files={codex_home / "config.toml": config})
    if cli == "opencode":
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"scripted/{model}",
            "small_model": f"scripted/{model}",
            "provider": {"scripted": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Scripted upstream",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": API_KEY},
                "models": {model: {"name": model, "tool_call": True, "attachment": False, "reasoning": False,
                                   "temperature": True, "limit": {"context": 128000, "output": 8000}}},
            }},
        }
        env.update(OPENCODE_CONFIG_CONTENT=json.dumps(config), OPENCODE_DISABLE_MODELS_FETCH="1",
                   OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_SHARE="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
                   OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_CLAUDE_CODE="1")
        return Launch([*binary(cli), "run", prompt], env)
    if cli == "aider":
        # aider knows gpt-4o from litellm's bundled table (LITELLM_LOCAL_MODEL_COST_MAP); its
        # own download of that table is skipped by giving the models' metadata locally, as its
        # documentation says for any model (--model-metadata-file).
        metadata = {name: {"max_input_tokens": 128000, "max_output_tokens": 16384, "max_tokens": 16384,
                           "input_cost_per_token": 0.0000025, "output_cost_per_token": 0.00001,
                           "litellm_provider": "openai", "mode": "chat", "supports_function_calling": True}
                    for name in ("gpt-4o", "gpt-4o-mini", "openai/gpt-4o", "openai/gpt-4o-mini")}
        meta_path = private_home / "model-metadata.json"
        env.update(OPENAI_API_KEY=API_KEY, OPENAI_API_BASE=f"{base_url}/v1", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   LITELLM_TELEMETRY="False", AIDER_ANALYTICS="false", AIDER_CHECK_UPDATE="false",
                   TIKTOKEN_CACHE_DIR=str(private_home / ".cache" / "tiktoken"))
        argv = [*binary(cli), "--model", model, "--model-metadata-file", str(meta_path),
                "--no-check-update", "--analytics-disable", "--no-show-model-warnings", "--yes-always",
                "--no-auto-commits", "--no-dirty-commits", "--no-gitignore", "--no-pretty", "--no-fancy-input",
                "--stream", "--edit-format", "diff", "--map-tokens", "1024",
                "--chat-history-file", str(private_home / "aider.chat.history.md"),
                "--input-history-file", str(private_home / "aider.input.history"),
                "--llm-history-file", str(private_home / "aider.llm.history")]
        return Launch(argv, env, stdin=stdin, files={meta_path: json.dumps(metadata)})
    raise ValueError(f"unknown CLI {cli!r}")


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        raise SystemExit(install())
    if sys.argv[1:] == ["versions"]:
        for name in CLIS:
            print(name, missing(name) or version(name))
        raise SystemExit(0)
    print("usage: python3 tests/agents/clis.py install|versions", file=sys.stderr)
    raise SystemExit(2)
