"""The real Codex CLI (openai-codex-cli-bin, `codex exec`) against `tern serve` over the Responses API, offline,
with a temporary CODEX_HOME holding a custom provider (docs: /work/shared/docs/clients.md). The model's answer is
nonsense; what matters is that the CLI accepts the server's stream and exits 0."""
from helpers import check_cli_turn, clean_env, openai_client, run_cli

SERVER_ARGS = ["--ctx", "32768", "--max-tokens", "1000", "--seed", "1"]
CLI_TIMEOUT_S = 300


def codex_path():
    from codex_cli_bin import bundled_codex_path
    return str(bundled_codex_path())


# Codex's prompt carries the date and the working directory, so tern-tiny's nonsense differs from day to day,
# and now and then runs past --max-tokens without an end of turn: Codex then exits 1 on the incomplete response
# ("reason: max_output_tokens"). That, and only that, is retried with the next seed.
INCOMPLETE = "Incomplete response returned, reason: max_output_tokens"


def test_codex_exec(start_server, tmp_path):
    for seed in (1, 2, 3):
        server = start_server(*SERVER_ARGS[:-1], str(seed))
        home = tmp_path / f"codex-home-{seed}"
        work = tmp_path / "work"
        home.mkdir()
        work.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            'model = "qwen3.6-35b-a3b"\n'
            'model_provider = "tern"\n'
            "[model_providers.tern]\n"
            'name = "tern"\n'
            f'base_url = "{server.v1}"\n'
            'wire_api = "responses"\n')
        env = clean_env(CODEX_HOME=str(home), HOME=str(tmp_path), OPENAI_API_KEY="anything")
        rc, out, err = run_cli([codex_path(), "exec", "--skip-git-repo-check", "Say hello in one short sentence."],
                               work, env, CLI_TIMEOUT_S)
        if rc != 0 and INCOMPLETE in err and seed < 3:
            continue
        check_cli_turn(server, "codex", "responses", rc, out, err)
        return


def test_codex_shaped_request(server):
    """What Codex 0.163.0 sends (see test_codex_exec), reduced: besides function tools, a "namespace" tool grouping
    function tools and the hosted "web_search" tool, plus reasoning {summary: auto}, include
    ["reasoning.encrypted_content"], store false, prompt_cache_key and client_metadata. Both tool types are in the
    openai SDK's ToolParam; the server must accept the request (it may ignore the tools it cannot run)."""
    fn = {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
                         "additionalProperties": False}}
    body = {
        "model": "qwen3.6-35b-a3b",
        "instructions": None,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
        ],
        "tools": [
            fn,
            {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.",
             "tools": [{"type": "function", "name": "close_agent", "description": "Close an agent.", "strict": False,
                        "parameters": {"type": "object", "properties": {"target": {"type": "string"}},
                                       "required": ["target"], "additionalProperties": False}}]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-test",
        "client_metadata": {"x": "y"},
        "max_output_tokens": 20,
        "temperature": 0,
    }
    r = server.post("/v1/responses", body)
    assert r.status == 200, r
    assert r.json()["status"] in ("completed", "incomplete")
    status, frames, raw = server.sse("/v1/responses", dict(body, stream=True))
    assert status == 200, raw[:1000]
    assert frames[-1][0] in ("response.completed", "response.incomplete"), raw[-1000:]


def test_responses_function_tools_only_ok(server):
    """The same request with its function tools only is answered: the tool types above are the difference."""
    c = openai_client(server)
    r = c.responses.create(model="qwen3.6-35b-a3b", input="Say hello", max_output_tokens=10, temperature=0,
                           tools=[{"type": "function", "name": "exec_command", "description": "Run a command",
                                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}])
    assert r.status in ("completed", "incomplete")
