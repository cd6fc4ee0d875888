#!/usr/bin/env python3
"""Render kiln's chat-template test cases with transformers, the reference kiln must match.

Writes tests/tokenizer/chat_templates.json: {"source", "cases": [{"name", "template", "messages",
"add_generation_prompt", "kwargs", "special_tokens", "rendered" | "error"}]}. Rendering goes through
transformers' own `render_jinja_template` (the function behind `apply_chat_template(tokenize=False)`),
so the sandbox settings, `tojson`, `raise_exception` and `strftime_now` are transformers' own.

The templates are written for this test (not copied from a model repo); they exercise what real
templates (Qwen3, Llama 3, SmolLM2) use: whitespace control with trim/lstrip_blocks, namespace(),
reversed slices, `is string` / `is defined` / `is false`, str methods (split, strip, startswith,
removeprefix), tojson with non-ASCII and HTML characters, Python printing of bools/None/floats/
lists/dicts, macros, loop.previtem/nextitem, and raise_exception.

The `qwen3_5_*` cases use the real Qwen3.5 chat template, `qwen3_5_chat_template.jinja` beside this
script (a copy of the template shipped with the Qwen3.5 checkpoints, from the public
`mlx-community/Qwen3.5-35B-A3B-4bit` repository, 7,756 bytes): `enable_thinking` on, off and unset,
no tools, multi-turn reasoning, and a conversation without a user message (the template raises).

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
    /tmp/venv/bin/python tests/tokenizer/gen_chat_templates.py
"""

import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

QWEN3_LIKE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "system" %}
        {#- the first system message was written above #}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (loop.previtem.role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or (loop.nextitem.role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

LLAMA3_LIKE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if custom_tools is defined %}
    {{- "Functions:\\n" }}
    {%- for t in custom_tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

PYTHON_VALUES = """{% macro show(label, value) -%}
{{ label }}={{ value }}
{% endmacro -%}
{{ show('bool', flag) }}{{ show('none', nothing) }}{{ show('float', ratio) }}{{ show('big', big) }}{{ show('small', small) }}
{{- show('list', items) }}{{ show('dict', obj) }}{{ show('quote', quote) }}
{%- for k, v in obj.items() %}
  {{ k }} -> {{ v }}
{% endfor %}
json: {{ obj | tojson }}
sorted: {{ obj | tojson(sort_keys=True) }}
compact: {{ items | tojson(separators=(',', ':')) }}
upper: {{ messages[0]['content'].upper() }} | {{ messages[0]['content'].removeprefix('hel') }}
{% if messages|length > 1 %}{{ raise_exception('Only one message is supported, got ' ~ messages|length) }}{% endif %}
"""

BUILTINS = """{%- set roles = messages | map(attribute='role') | list %}
roles: {{ roles | join(', ') }} ({{ messages | length }}, first {{ (messages | first).role }}, last {{ (messages | last).role }})
users: {{ messages | selectattr('role', 'equalto', 'user') | list | length }}
default: {{ missing | default('fallback') }} / {{ ratio | default(1) }}
string: {{ flag | string }} {{ nothing | string }} {{ items | string }}
arith: {{ 7 // 2 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 2 ** 10 }} {{ 7 % 3 }} {{ -3 | abs }} {{ 3.7 | int }} {{ 2 | float }} {{ (2.567 | round(1)) }}
text: {{ '  pad  ' | trim }}|{{ 'a-b-c' | replace('-', '+') }}|{{ 'Title me' | title }}|{{ 'x' * 3 }}|{{ 'abc'[::-1] }}|{{ 'abc'[1:] }}
tests: {{ 'ab' in 'cabd' }} {{ nothing is none }} {{ items is sequence }} {{ obj is mapping }} {{ 3 is number }} {{ 'a' is string }}
{%- for m in messages if m.role != 'system' %}
{{ loop.index }}/{{ loop.length }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}: {{ m.content | capitalize }}
{%- endfor %}
dict: {% for k in obj | dictsort %}{{ k[0] }} {% endfor %}| {{ obj.keys() | list }} | {{ obj.get('mid') }} {{ obj.get('nope', 'd') }}
"""

SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
KWARGS_VALUES = {
    "flag": True,
    "nothing": None,
    "ratio": 0.25,
    "big": 1e20,
    "small": 1.5e-7,
    "items": [1, "two", 3.0, False, None],
    "obj": {"zeta": "Wx <city> & ü \"q\" \\ \n", "alpha": [1, {"b": None}], "mid": 2.0},
    "quote": "it's",
}


def case(name, template, messages, add_generation_prompt=True, kwargs=None):
    kwargs = kwargs or {}
    entry = {
        "name": name,
        "template": template,
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "kwargs": kwargs,
        "special_tokens": SPECIAL,
    }
    try:
        rendered, _ = render_jinja_template(
            conversations=[messages],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **{**SPECIAL, **kwargs},
        )
        entry["rendered"] = rendered[0]
    except Exception as e:  # the template raised: kiln must fail too, with this message
        entry["error"] = str(e)
    return entry


def m(role, content):
    return {"role": role, "content": content}


QWEN3_5 = (pathlib.Path(__file__).parent / "qwen3_5_chat_template.jinja").read_text(encoding="utf-8")


CASES = [
    case("qwen3_single_user", QWEN3_LIKE, [m("user", "What is the capital of France?")]),
    case("qwen3_thinking_off", QWEN3_LIKE, [m("user", "Hi")], kwargs={"enable_thinking": False}),
    case("qwen3_thinking_on", QWEN3_LIKE, [m("user", "Hi")], kwargs={"enable_thinking": True}),
    case(
        "qwen3_multi_turn_reasoning",
        QWEN3_LIKE,
        [
            m("system", "Be brief."),
            m("user", "2+2?"),
            m("assistant", "<think>\nadd them\n</think>\n\n4"),
            m("user", "and 3+3?"),
            m("assistant", "<think>\nagain\n</think>\n\n6"),
        ],
        add_generation_prompt=False,
    ),
    case(
        "qwen3_tool_results_fold_into_one_turn",
        QWEN3_LIKE,
        [m("user", "Weather?"), m("assistant", "calling"), m("tool", "sunny"), m("tool", "22°C")],
    ),
    case("qwen3_bad_role_raises", QWEN3_LIKE, [m("user", "x"), m("critic", "y")]),
    case(
        "llama3_system_and_tools",
        LLAMA3_LIKE,
        [m("system", "  You are kiln.  "), m("user", " Hello! "), m("assistant", "Hi."), m("user", "Bye")],
        kwargs={
            "date_string": "01 Jan 2026",
            "custom_tools": [
                {"name": "get_weather", "description": "Wx <city> & ü", "parameters": {"city": {"type": "string"}}}
            ],
        },
    ),
    case("llama3_no_system_no_prompt", LLAMA3_LIKE, [m("user", "Hello")], add_generation_prompt=False),
    case("python_values", PYTHON_VALUES, [m("user", "hello")], kwargs=KWARGS_VALUES),
    case(
        "jinja_builtins",
        BUILTINS,
        [m("system", "s"), m("user", "hello there"), m("assistant", "general kenobi"), m("user", "bye")],
        kwargs=KWARGS_VALUES,
    ),
    case("python_values_raise", PYTHON_VALUES, [m("user", "a"), m("user", "b")], kwargs=KWARGS_VALUES),
]

CASES += [
    case("qwen3_5_single_user", QWEN3_5, [m("user", "Hello, who are you?")]),
    case("qwen3_5_thinking_off", QWEN3_5, [m("user", "2+2?")], kwargs={"enable_thinking": False}),
    case("qwen3_5_thinking_on", QWEN3_5, [m("system", "Be brief."), m("user", "2+2?")], kwargs={"enable_thinking": True}),
    case(
        "qwen3_5_multi_turn_reasoning",
        QWEN3_5,
        [
            m("system", "You are kiln."),
            m("user", "2+2?"),
            m("assistant", "<think>\nadd them\n</think>\n\n4"),
            m("user", "and 3+3?"),
        ],
        kwargs={"enable_thinking": False},
    ),
    case(
        "qwen3_5_history_without_prompt",
        QWEN3_5,
        [m("user", "Hi"), m("assistant", "<think>\nsay hi\n</think>\n\nHello! \u00fc")],
        add_generation_prompt=False,
    ),
    case("qwen3_5_no_user_message_raises", QWEN3_5, [m("system", "Only a system prompt.")]),
]

out = pathlib.Path(__file__).with_name("chat_templates.json")
doc = {
    "source": f"Generated with tests/tokenizer/gen_chat_templates.py (transformers {transformers.__version__}, "
    "transformers.utils.chat_template_utils.render_jinja_template)",
    "cases": CASES,
}
out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
print(f"wrote {out} ({len(CASES)} cases)")
