"""Network failures: one line naming the host, the port and what failed; huggingface_hub's retry logs
only with -v. The CLI runs in a subprocess (stderr exactly as a user sees it) against a closed loopback
port, with fast retries."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys

import httpx2
import pytest

from kimi_audit.sources.hub_network import RETRY_LOGGER, cannot_connect, host_port, show_retry_logs

REPO = "moonshotai/Kimi-K2-Instruct"
# The CLI as `kimi-audit` runs it, with 2 retries 10 ms apart instead of 3 retries from 1 s apart.
FAST_CLI = ("import kimi_audit.sources.hub as hub; "
            "hub.HubSource.__init__.__kwdefaults__.update(max_retries=2, retry_wait=0.01); "
            "from kimi_audit.cli import main; main()")


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def run_cli(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_OFFLINE", "HF_HUB_VERBOSITY"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", COLUMNS="300", NO_COLOR="1")
    return subprocess.run([sys.executable, "-c", FAST_CLI, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.timeout(60)
def test_refused_connection_is_one_line_naming_host_and_port():
    port = closed_port()
    r = run_cli(port, "audit", REPO)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"cannot connect to 127.0.0.1:{port} (connection refused)" in lines[0]
    assert f"while resolving {REPO}@fd1984e" in lines[0] and "HF_ENDPOINT" in lines[0]
    assert "Retrying" not in r.stderr and "thrown while requesting" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(60)
def test_verbose_shows_huggingface_hub_retry_logs():
    port = closed_port()
    r = run_cli(port, "-v", "audit", f"{REPO}@main")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2
    assert sum("Retrying in" in line for line in lines) == 2  # max_retries=2
    assert sum(f"127.0.0.1:{port}" in line and "thrown while requesting" in line for line in lines) == 3
    assert f"cannot connect to 127.0.0.1:{port} (connection refused) while resolving {REPO}@main" in lines[-1]


def test_failures_in_words():
    def chained(outer: Exception, cause: BaseException) -> Exception:
        outer.__cause__ = cause
        return outer

    dns = chained(httpx2.ConnectError("[Errno -2] Name or service not known"),
                  socket.gaierror(-2, "Name or service not known"))
    assert cannot_connect(dns, "https://huggingface.co", f"{REPO}@main", "resolving", 10, 4) == (
        "cannot connect to huggingface.co:443 (host name not found: Name or service not known) while resolving "
        f"{REPO}@main — check HF_ENDPOINT and your network")
    tls = chained(httpx2.ConnectError("handshake"), ssl.SSLCertVerificationError(1, "certificate verify failed"))
    assert "(TLS handshake failed: " in cannot_connect(tls, "https://hub.example:8443", f"{REPO}@main", "x", 10, 4)
    unreachable = chained(httpx2.ConnectError("[Errno 101] Network is unreachable"),
                          OSError(101, "Network is unreachable"))
    assert "(network is unreachable)" in cannot_connect(unreachable, "http://10.0.0.1", "a/b@v1", "x", 10, 4)
    timeout = httpx2.ConnectTimeout("timed out")
    text = cannot_connect(timeout, "http://[::1]:9/", "a/b@" + "ab" * 20, "reading config.json of", 0.5, 2)
    assert text.startswith("cannot connect to [::1]:9 (no answer in 0.5 s, 2 attempts) while reading config.json "
                           "of a/b@ababab")
    assert host_port("https://user:secret@hub.example/") == "hub.example:443"  # no user info


def test_retry_filter_hides_only_retry_lines(caplog):
    logger = logging.getLogger(RETRY_LOGGER)
    try:
        show_retry_logs(False)
        show_retry_logs(False)  # idempotent: one filter
        with caplog.at_level(logging.WARNING, logger=RETRY_LOGGER):
            logger.warning("'boom' thrown while requesting GET http://x/y")
            logger.warning("Retrying in 1.0s [Retry 1/3].")
            logger.warning("this repo is deprecated")  # a server X-HF-Warning: still shown
        assert [r.getMessage() for r in caplog.records] == ["this repo is deprecated"]
        caplog.clear()
        show_retry_logs(True)
        with caplog.at_level(logging.WARNING, logger=RETRY_LOGGER):
            logger.warning("Retrying in 1.0s [Retry 1/3].")
        assert len(caplog.records) == 1
    finally:
        show_retry_logs(True)
