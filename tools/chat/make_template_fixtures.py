#!/usr/bin/env python3
"""Renders tests/fixtures/chat/qwen3.6.jinja over many conversations with
transformers' own apply_chat_template and writes the results as fixtures for
the native C renderer (src/text/chat_template.c).

    python3 tools/chat/make_template_fixtures.py   # from the repository root

The template is the published Qwen/Qwen3.6-35B-A3B chat_template.jinja
(md5 52b6d51ae5b203cb67e64b648494dad2, 7764 bytes, no trailing newline);
this script refuses to run on any other bytes.

Before rendering, messages go through the normalisation vLLM applies to an
OpenAI request (vllm/entrypoints/chat_utils.py, _postprocess_messages):
assistant tool_call arguments given as a JSON string are parsed into an
object, and empty/absent arguments become {}. The template itself needs an
object (it iterates `arguments|items`), so every OpenAI-compatible server
does this, and the C renderer does the same.

Output: tests/fixtures/chat/template_cases.json, a list of
  {"name", "messages", "tools", "options", "expected"}     rendered text, or
  {"name", "messages", "tools", "options", "error"}        the exception text
where options = {add_generation_prompt, enable_thinking, preserve_thinking,
add_vision_id}; a missing option means "not passed to the template".
"""
import copy
import hashlib
import json
import pathlib
import sys

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests/fixtures/chat/qwen3.6.jinja"
OUT = ROOT / "tests/fixtures/chat/template_cases.json"
TEMPLATE_MD5 = "52b6d51ae5b203cb67e64b648494dad2"


def make_tokenizer(template: str) -> PreTrainedTokenizerFast:
    # Only the template matters for tokenize=False; a one-word vocabulary is
    # enough to build a real tokenizer object and use its apply_chat_template.
    tok = Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = template
    return fast


def vllm_normalise(messages):
    """vLLM's _postprocess_messages: JSON-string tool arguments -> dict."""
    msgs = copy.deepcopy(messages)
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        calls = m.get("tool_calls")
        if not isinstance(calls, list):
            continue
        if not calls:
            m.pop("tool_calls")
            continue
        for item in calls:
            if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
                continue
            fn = item["function"]
            args = fn.get("arguments")
            if args:
                if not isinstance(args, (dict, list)):
                    fn["arguments"] = json.loads(args)
            else:
                fn["arguments"] = {}
    return msgs


# ---------------------------------------------------------------------------
# Building blocks

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web. Quotes \"like this\" and <tags> & ampersands.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "number", "default": 2.5},
                "filters": {"type": "object"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "safe": {"type": "boolean"},
            },
            "required": ["query"],
        },
    },
}
RUN = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a command.\nMultiline description\twith a tab.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, SEARCH, RUN]


def call(name, args, wrap=True, id_="call_1"):
    fn = {"name": name, "arguments": args}
    return {"id": id_, "type": "function", "function": fn} if wrap else fn


def sys_(c):
    return {"role": "system", "content": c}


def user(c):
    return {"role": "user", "content": c}


def asst(c, **kw):
    m = {"role": "assistant", "content": c}
    m.update(kw)
    return m


def tool(c, id_="call_1"):
    return {"role": "tool", "tool_call_id": id_, "content": c}


GEN = {"add_generation_prompt": True}
NOGEN = {"add_generation_prompt": False}

CASES = [
    # plain chat
    ("plain_user", [user("Hello!")], None, GEN),
    ("plain_user_no_gen", [user("Hello!")], None, NOGEN),
    ("plain_user_default_options", [user("Hi")], None, {}),
    ("system_user", [sys_("You are terse."), user("2+2?")], None, GEN),
    ("system_user_no_thinking", [sys_("You are terse."), user("2+2?")], None,
     {"add_generation_prompt": True, "enable_thinking": False}),
    ("no_thinking_no_gen", [user("2+2?"), asst("4")], None,
     {"add_generation_prompt": False, "enable_thinking": False}),
    ("enable_thinking_true_explicit", [user("x")], None,
     {"add_generation_prompt": True, "enable_thinking": True}),
    ("trim_whitespace", [sys_("  \n sys \t\n"), user("\u3000 hi \u00a0\n")], None, GEN),
    ("unicode", [user("Grüße 👋 日本語 \"quotes\" \\ back")], None, GEN),
    ("null_user_content", [user(None), user("second")], None, GEN),
    # multi-turn and reasoning
    ("multi_turn", [user("Hi"), asst("Hello."), user("How are you?")], None, GEN),
    ("reasoning_before_last_query_dropped",
     [user("Q1"), asst("A1", reasoning_content="thinking 1"), user("Q2")], None, GEN),
    ("reasoning_before_last_query_preserved",
     [user("Q1"), asst("A1", reasoning_content="thinking 1"), user("Q2")], None,
     {"add_generation_prompt": True, "preserve_thinking": True}),
    ("reasoning_after_last_query_kept",
     [user("Q1"), asst("A1", reasoning_content="  \nthinking 1\n\n ")], None, NOGEN),
    ("reasoning_split_from_content_after_query",
     [user("Q1"), asst("<think>\nmy thoughts\n</think>\n\nThe answer.")], None, NOGEN),
    ("reasoning_split_from_content_before_query",
     [user("Q1"), asst("<think>\nold thoughts\n</think>\n\nOld answer."), user("Q2")], None, GEN),
    ("reasoning_split_no_open_tag",
     [user("Q1"), asst("just thoughts\n</think>\n\nAnswer")], None, NOGEN),
    ("reasoning_split_nested_tags",
     [user("Q1"), asst("<think>a<think>\nb\n\n</think>c</think>\n\nd")], None, NOGEN),
    ("reasoning_content_wins_over_split",
     [user("Q1"), asst("x</think>y", reasoning_content="")], None, NOGEN),
    ("reasoning_null_uses_split",
     [user("Q1"), asst("r</think>\n\nc", reasoning_content=None)], None, NOGEN),
    ("empty_assistant_after_query", [user("Q1"), asst("")], None, NOGEN),
    ("preserve_thinking_all_turns",
     [sys_("S"), user("Q1"), asst("A1", reasoning_content="R1"),
      user("Q2"), asst("A2", reasoning_content="R2"), user("Q3")], None,
     {"add_generation_prompt": True, "preserve_thinking": True, "enable_thinking": False}),
    ("preserve_thinking_false_explicit",
     [user("Q1"), asst("A1", reasoning_content="R1"), user("Q2")], None,
     {"add_generation_prompt": True, "preserve_thinking": False}),
    # content as parts, vision
    ("text_parts", [user([{"type": "text", "text": "part one, "},
                          {"type": "text", "text": "part two"}])], None, GEN),
    ("system_text_parts", [sys_([{"type": "text", "text": " sys parts "}]), user("hi")],
     [WEATHER], GEN),
    ("images_and_video",
     [user([{"type": "text", "text": "Look: "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image", "image": "file.png"},
            {"type": "video", "video": "clip.mp4"},
            {"type": "text", "text": " what is this?"}])], None, GEN),
    ("images_vision_id",
     [user([{"type": "image_url", "image_url": {"url": "a"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "b"}}]),
      asst("two images"),
      user([{"type": "video", "video": "v"}, {"type": "image", "image": "c"}])], None,
     {"add_generation_prompt": True, "add_vision_id": True}),
    ("image_only_user", [user([{"type": "image", "image": "x"}])], None, GEN),
    ("assistant_text_parts",
     [user("q"), asst([{"type": "text", "text": "<think>r</think>"},
                       {"type": "text", "text": "answer"}])], None, NOGEN),
    # tools
    ("tools_no_system", [user("Weather in Paris?")], TOOLS, GEN),
    ("tools_with_system", [sys_("Be helpful."), user("Weather in Paris?")], TOOLS, GEN),
    ("tools_empty_system", [sys_("   "), user("Weather?")], [WEATHER], GEN),
    ("tools_empty_list", [user("x")], [], GEN),
    ("tool_call_string_arg",
     [user("Weather in Paris?"),
      asst("", tool_calls=[call("get_weather", {"city": "Paris"})])], TOOLS, NOGEN),
    ("tool_call_typed_args",
     [user("search"),
      asst(None, tool_calls=[call("search", {
          "query": "multi\nline <b>&</b>", "limit": 10, "ratio": 0.1, "big": 1e20,
          "small": 1.5e-7, "neg": -0.0, "whole": 3.0, "safe": True, "off": False,
          "none": None, "filters": {"lang": "en", "nested": {"a": [1, 2.5, "x"]}},
          "tags": ["a", "b\u00e9", 7], "empty_obj": {}, "empty_list": [],
          "ctrl": "tab\tbell\u0007"})])],
     TOOLS, NOGEN),
    ("tool_call_json_string_args",
     [user("search"),
      asst("", tool_calls=[call("search", '{"query": "cats", "limit": 3, "safe": true}')])],
     TOOLS, NOGEN),
    ("tool_call_empty_string_args",
     [user("run"), asst("", tool_calls=[call("run_shell", "")])], TOOLS, NOGEN),
    ("tool_call_null_args",
     [user("run"), asst("", tool_calls=[call("run_shell", None)])], TOOLS, NOGEN),
    ("tool_calls_multiple",
     [user("Paris and Rome?"),
      asst("", tool_calls=[call("get_weather", {"city": "Paris", "days": 2}),
                           call("get_weather", {"city": "Rome", "unit": "celsius"}, id_="call_2")])],
     TOOLS, NOGEN),
    ("tool_call_with_content",
     [user("Paris?"),
      asst("Let me check.", tool_calls=[call("get_weather", {"city": "Paris"})])], TOOLS, NOGEN),
    ("tool_call_with_reasoning",
     [user("Paris?"),
      asst("", reasoning_content="Need weather.", tool_calls=[call("get_weather", {"city": "Paris"})])],
     TOOLS, NOGEN),
    ("tool_call_unwrapped",
     [user("Paris?"), asst("", tool_calls=[call("get_weather", {"city": "Paris"}, wrap=False)])],
     TOOLS, NOGEN),
    ("tool_calls_empty_list", [user("x"), asst("y", tool_calls=[])], TOOLS, NOGEN),
    ("tool_round_trip",
     [sys_("S"), user("Weather in Paris?"),
      asst("", reasoning_content="call it", tool_calls=[call("get_weather", {"city": "Paris"})]),
      tool('{"temp": 21, "sky": "clear"}'),
      asst("It is 21 and clear.", reasoning_content="got it")], TOOLS, NOGEN),
    ("tool_results_consecutive",
     [user("Paris and Rome?"),
      asst("", tool_calls=[call("get_weather", {"city": "Paris"}),
                           call("get_weather", {"city": "Rome"}, id_="call_2")]),
      tool("Paris: 21"), tool("Rome: 25", id_="call_2")], TOOLS, GEN),
    ("tool_results_then_answer_then_query",
     [user("Q1"),
      asst("", reasoning_content="r1", tool_calls=[call("run_shell", {"cmd": "ls"})]),
      tool("a\nb"), tool("  padded  "),
      asst("done", reasoning_content="r2"),
      user("Q2")], TOOLS, GEN),
    ("tool_results_preserve_thinking",
     [user("Q1"),
      asst("", reasoning_content="r1", tool_calls=[call("run_shell", {"cmd": "ls"})]),
      tool("out"), asst("done", reasoning_content="r2"), user("Q2")], TOOLS,
     {"add_generation_prompt": True, "preserve_thinking": True}),
    ("tool_results_no_thinking",
     [user("Q"), asst("", tool_calls=[call("run_shell", {"cmd": "pwd"})]), tool("/root")],
     TOOLS, {"add_generation_prompt": True, "enable_thinking": False}),
    ("tool_result_parts",
     [user("Q"), asst("", tool_calls=[call("run_shell", {"cmd": "pwd"})]),
      tool([{"type": "text", "text": "/ro"}, {"type": "text", "text": "ot"}])], TOOLS, GEN),
    ("user_wrapped_tool_response_not_a_query",
     [user("Real question"), asst("thinking out loud", reasoning_content="r"),
      user("<tool_response>\nresult\n</tool_response>")], None, GEN),
    ("tool_first_message",
     [tool("orphan"), user("Q")], None, GEN),
    # errors the template raises
    ("error_no_messages", [], None, GEN),
    ("error_developer_role", [{"role": "developer", "content": "dev"}, user("Q")], None, GEN),
    ("error_system_not_first", [user("Q"), sys_("late")], None, GEN),
    ("error_no_user_query", [sys_("S"), asst("A")], None, GEN),
    ("error_only_tool_responses", [user("<tool_response>x</tool_response>")], None, GEN),
    ("error_unknown_role", [user("Q"), {"role": "critic", "content": "c"}], None, GEN),
    ("error_image_in_system", [sys_([{"type": "image", "image": "x"}]), user("Q")], None, GEN),
    ("error_unknown_part", [user([{"type": "input_audio", "input_audio": {}}])], None, GEN),
    ("error_content_type", [user({"text": "a mapping"})], None, GEN),
    ("error_content_number", [user(42)], None, GEN),
    ("error_tool_call_args_list",
     [user("Q"), asst("", tool_calls=[call("run_shell", [1, 2])])], TOOLS, GEN),
    ("error_tool_call_args_bad_json",
     [user("Q"), asst("", tool_calls=[call("run_shell", "{not json")])], TOOLS, GEN),
    ("error_tool_call_no_name",
     [user("Q"), asst("", tool_calls=[{"type": "function", "function": {"arguments": {}}}])],
     TOOLS, GEN),
]


def render(tok, messages, tools, options):
    kwargs = dict(options)
    kwargs.setdefault("add_generation_prompt", False)
    return tok.apply_chat_template(
        vllm_normalise(messages), tools=tools, tokenize=False, **kwargs)


def main() -> int:
    data = TEMPLATE.read_bytes()
    if hashlib.md5(data).hexdigest() != TEMPLATE_MD5:
        print(f"{TEMPLATE}: not the published Qwen3.6 template (md5 mismatch)", file=sys.stderr)
        return 1
    tok = make_tokenizer(data.decode("utf-8"))
    out = []
    names = set()
    for name, messages, tools, options in CASES:
        assert name not in names, name
        names.add(name)
        case = {"name": name, "messages": messages, "tools": tools, "options": options}
        try:
            case["expected"] = render(tok, messages, tools, options)
        except Exception as e:  # the template's raise_exception and jinja type errors
            case["error"] = str(e)
        out.append(case)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_err = sum("error" in c for c in out)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(out)} cases ({n_err} expected errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
