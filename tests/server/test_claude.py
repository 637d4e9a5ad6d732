"""The real Claude Code CLI (bundled in claude-agent-sdk) against `tern serve` over the Messages API, offline, with
a temporary HOME (docs: /work/shared/docs/clients.md). The model's answer is nonsense; what matters is that the CLI
accepts the server's stream and exits 0."""
from pathlib import Path

from helpers import check_cli_turn, clean_env, parse_sse, run_cli

# Claude Code's first request is ~28 K tokens (its system prompt and 12+ tools) and asks max_tokens 32000.
SERVER_ARGS = ["--ctx", "65536"]
CLI_TIMEOUT_S = 300


def claude_path():
    import claude_agent_sdk
    p = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    assert p.exists(), p
    return str(p)


def test_claude_print(server, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(HOME=str(tmp_path), ANTHROPIC_BASE_URL=server.base, ANTHROPIC_API_KEY="anything",
                    DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    rc, out, err = run_cli([claude_path(), "-p", "Say hello in one short sentence.", "--model", "qwen3.6-35b-a3b"],
                           work, env, CLI_TIMEOUT_S)
    check_cli_turn(server, "claude", "messages", rc, out, err)


def test_claude_shaped_request(server):
    """What Claude Code 2.1.327 sends (see test_claude_print), reduced: POST /v1/messages?beta=true, stream, system
    as text blocks with cache_control, thinking {type: adaptive}, output_config {effort}, context_management,
    metadata, tools with cache_control, and a {"role": "system"} message after the user's turn (anthropic's
    SystemMessageParam). The server must answer it with a complete stream."""
    body = {
        "model": "qwen3.6-35b-a3b",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nBe nice.\n</system-reminder>\n"},
                {"type": "text", "text": "Say hello", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\n - Platform: linux"}]},
        ],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.327;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "Bash", "description": "Run a command",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                    "required": ["command"]},
                   "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "{\"device_id\":\"abc\"}"},
        "max_tokens": 32,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
        "temperature": 0,
    }
    status, frames, raw = server.sse("/v1/messages?beta=true", body)
    assert status == 200, raw[:1000]
    events = [e for e, _ in frames if e != "ping"]
    assert events[0] == "message_start" and events[-1] == "message_stop", events


def test_claude_shaped_request_without_system_message(server):
    """The same request with the system message folded into the user's turn is answered: the role is the difference."""
    body = {
        "model": "qwen3.6-35b-a3b",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"},
                                                  {"type": "text", "text": "# Environment\n - Platform: linux"}]}],
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "max_tokens": 32, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "stream": True, "temperature": 0,
    }
    status, frames, raw = server.sse("/v1/messages?beta=true", body)
    assert status == 200, raw[:1000]
    assert parse_sse(raw)[-1][0] == "message_stop"
