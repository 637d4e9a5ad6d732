"""The prefix cache's measuring tools against a running server (docs/PERFORMANCE.md, "Prefix cache"): a small
agent trace from tools/agent_trace.py, replayed by tools/replay_trace.py, and tools/continue_probe.py's
follow-ups of one conversation. Each reports what the server's usage says: the later requests reuse cached
prompt tokens, the follow-ups reuse at least the conversation they continue."""
import json
import subprocess
import sys

import pytest

from helpers import REPO

SERVER_ARGS = ["--ctx", "16384", "--slots", "1", "--preserve-thinking", "--cache-checkpoint-interval", "256"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    subprocess.run([sys.executable, "tools/agent_trace.py", "--out", str(path), "--turns", "4",
                    "--system-tokens", "600", "--conversations", "1", "--max-result-tokens", "300"],
                   cwd=REPO, check=True, timeout=120)
    return path


def tool(name, *args, timeout=600):
    p = subprocess.run([sys.executable, f"tools/{name}", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p


def test_replay_reports_the_reuse(server, trace, tmp_path):
    out = tmp_path / "replay.json"
    tool("replay_trace.py", "--url", server.base, str(trace), "--max-tokens", "4", "--json", str(out))
    rep = json.loads(out.read_text())
    rows = rep["rows"]
    assert len(rows) == 4 and rows[0]["cached_tokens"] == 0
    # each later request resends the one before it and more: most of it is reused
    for prev, row in zip(rows, rows[1:]):
        assert row["cached_tokens"] >= prev["prompt_tokens"] // 2, rows
    assert 0.5 < rep["summary"]["hit_rate_after_first"] < 1.0


def test_probe_continues_the_conversation(server, trace, tmp_path):
    out = tmp_path / "probe.json"
    tool("continue_probe.py", "--url", server.base, str(trace), "--context", "1000", "--new", "60",
         "--repeats", "2", "--gap", "0", "--json", str(out))
    rep = json.loads(out.read_text())
    assert len(rep["rows"]) == 2
    for row in rep["rows"]:
        assert row["cached_tokens"] >= 1000 and 0 < row["new_tokens"] < 200, row
        assert row["ttft_ms"] is not None
