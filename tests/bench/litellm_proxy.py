"""LiteLLM's proxy (``litellm[proxy]``) on the fake upstream, for ``tests.bench.proxy``: what
a widely used LLM proxy adds to a request on the same machine, beside ctxd's.

LiteLLM is never a dependency of ctxd or of its tests: it runs from an interpreter of its
own, given by ``--litellm PYTHON``, or ``--litellm auto``, which creates a virtualenv under
``bench-results/litellm-venv`` once and installs ``litellm[proxy]`` into it with pip.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.proxy.upstream import MODEL

AUTO_VENV = Path("bench-results/litellm-venv")


def interpreter(spec: str) -> Path:
    """The Python that runs LiteLLM: ``spec`` itself, or (``auto``) a virtualenv made for it.
    Raises RuntimeError with pip's own words when the install fails (offline, no wheel)."""
    if spec != "auto":
        python = Path(spec)
        if not python.exists():
            raise RuntimeError(f"--litellm {spec}: no such interpreter")
        return python
    python = (AUTO_VENV / "bin" / "python").absolute()  # (LiteLLM runs in a directory of its own)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(AUTO_VENV)], check=True)
    check = subprocess.run([str(python), "-c", "import litellm.proxy.proxy_server"], capture_output=True)
    if check.returncode != 0:
        print(f"installing litellm[proxy] into {AUTO_VENV} ...", file=sys.stderr, flush=True)
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "litellm[proxy]"],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            raise RuntimeError("pip install 'litellm[proxy]' failed:\n" + pip.stderr[-2000:])
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiteLLMProcess:
    """``litellm --config`` on 127.0.0.1, one model routed to the fake upstream's OpenAI API.
    Nothing is fetched at start (local cost map, no telemetry), no database; a master key of
    its own (it refuses to start without one), which requests carry (:attr:`headers`)."""

    def __init__(self, python: Path, upstream_url: str, workdir: Path) -> None:
        self.python = python
        self.workdir = workdir
        self.config = workdir / "litellm.yaml"
        self.key = "sk-" + secrets.token_hex(32)
        self.headers = {"authorization": f"Bearer {self.key}"}
        self.config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {upstream_url}/v1\n"
            "      api_key: bench\n"
            "general_settings:\n"
            f"  master_key: {self.key}\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> LiteLLMProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXD_", "OPENAI_", "ANTHROPIC_",
                                                                           "LITELLM_", "DATABASE_URL"))}
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False", LITELLM_LOG="ERROR",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        log = open(self.workdir / "litellm.log", "ab")  # noqa: SIM115 - the child keeps it
        litellm = self.python.parent / "litellm"
        argv = [str(litellm)] if litellm.exists() else [str(self.python), "-m", "litellm"]
        self.proc = subprocess.Popen([*argv, "--config", str(self.config), "--host", "127.0.0.1",
                                      "--port", str(self.port), "--num_workers", "1"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                     cwd=str(self.workdir))
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health/liveliness", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        tail = (self.workdir / "litellm.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"LiteLLM's proxy did not start:\n{tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
