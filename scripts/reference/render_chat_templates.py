"""Render chat templates with transformers' apply_chat_template and write the golden file that
crates/rlft-text/tests/chat_golden.rs reproduces byte for byte.

usage: python scripts/reference/render_chat_templates.py [OUT_JSON]
       (default OUT_JSON: crates/rlft-text/tests/data/chat_golden.json)

Each case is rendered through a PreTrainedTokenizerFast carrying the template and the model's
named special tokens, so the template sees exactly what apply_chat_template(tokenize=False) passes:
messages (null keys dropped), tools, documents, add_generation_prompt, bos/eos/unk/pad tokens and
extra kwargs. Two kinds of templates:
  - the real templates in crates/rlft-text/tests/data/templates/*.jinja (SmolLM2, Qwen2.5,
    Llama 3.1, Llama 3.2 Instruct), over a set of conversations;
  - small "probe" templates that pin down one Jinja/Python behaviour each (string methods,
    tojson variants, value printing, loops, filters, tests).
A case whose rendering raises records the exception message under "raises" instead of "text".
"""
import json
import os
import sys

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "crates", "rlft-text", "tests", "data")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(DATA, "chat_golden.json")

SPECIALS = {
    "smollm2-instruct.jinja": {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>",
    },
    "qwen2.5-instruct.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama-3.1-instruct.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.2-instruct.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}
PROBE_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}

SYS = {"role": "system", "content": "You are a careful arithmetic assistant. Return the final result in the format \\boxed{answer}."}
USER = {"role": "user", "content": "Compute this Python-style arithmetic expression.\nExpression: (13 * 2)\nReturn only the final result."}
CONVERSATIONS = {
    "system_user": [SYS, USER],
    "user_only": [{"role": "user", "content": "What is 2 + 2?"}],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "ends_with_assistant": [SYS, USER, {"role": "assistant", "content": "\\boxed{26}"}],
    "unicode_and_spacing": [
        {"role": "system", "content": "  Réponds en français, s'il te plaît.  \n"},
        {"role": "user", "content": "日本語 🤗 \"quotes\" \\backslash\\ tabs\tand\n\nnewlines  "},
        {"role": "assistant", "content": " Très bien — voilà ! "},
        {"role": "user", "content": "<tag> & 'single' </tag>"},
    ],
    "null_fields": [{"role": "user", "content": "hi", "name": None, "tool_calls": None}],
}
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
    {"role": "user", "content": "And tomorrow?"},
]

PROBES = {
    "string_methods": (
        "{% set s = messages[0].content %}{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|"
        "{{ s.strip(' H!') }}|{{ s.split() }}|{{ s.split('l') }}|{{ s.split(' ', 1) }}|{{ s.startswith('  He') }}|"
        "{{ s.endswith('!  ') }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.replace('l', 'L') }}|{{ s.count('l') }}|"
        "{{ s.find('o') }}|{{ s.rfind('o') }}|{{ s.strip().title() }}|{{ s.strip().capitalize() }}|"
        "{{ 'a\\nb\\n'.splitlines() }}|{{ '-'.join(['x', 'y']) }}|{{ 'x' in s }}|{{ s[2:5] }}|{{ s[::-1] }}"
    ),
    "value_printing": (
        "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ 1.0 }}|{{ 2.5e-7 }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}|{{ 7 / 2 }}|"
        "{{ 7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ [1, 'a', none, true] }}|{{ {'k': 'v', 'n': 1.5} }}|"
        "{{ messages[0] }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ bos_token }}|{{ nope }}|"
        "{{ messages[0].nope }}|{{ \"it's\" }}|{{ ['it\\'s', 'a\"b'] }}"
    ),
    "tojson_variants": (
        "{{ messages[0].data | tojson }}\n{{ messages[0].data | tojson(indent=2) }}\n"
        "{{ messages[0].data | tojson(indent=4, sort_keys=true) }}\n"
        "{{ messages[0].data | tojson(separators=(',', ':')) }}\n{{ messages[0].data | tojson(ensure_ascii=true) }}\n"
        "{{ messages[0].content | tojson }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ none | tojson }}"
    ),
    "dict_methods": (
        "{% for k, v in messages[0].data.items() %}{{ k }}={{ v }};{% endfor %}|{{ messages[0].data.keys() | list }}|"
        "{{ messages[0].data.get('missing', 'dflt') }}|{{ messages[0].data.get('float') }}|"
        "{{ messages[0].data | length }}|{{ 'float' in messages[0].data }}"
    ),
    "loops_and_namespace": (
        "{%- set ns = namespace(count=0, last_user=-1) %}"
        "{%- for m in messages %}"
        "{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}:"
        "{{ m.role }}{% if not loop.last %},{% endif %}"
        "{%- if m.role == 'user' %}{% set ns.count = ns.count + 1 %}{% set ns.last_user = loop.index0 %}{% endif %}"
        "{%- endfor %}|{{ ns.count }}|{{ ns.last_user }}"
        "{%- for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}[{{ m.content[:3] }}]{% endfor %}"
        "{%- for m in messages | reverse %}{{ m.role[0] }}{% endfor %}"
    ),
    "filters_and_tests": (
        "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}|"
        "{{ messages | map(attribute='role') | unique | list }}|{{ messages | length }}|{{ messages | first | attr('role') }}|"
        "{{ (messages | last).role }}|{{ messages[-1]['role'] }}|{{ '  pad  ' | trim }}|{{ 'abc' | upper }}|"
        "{{ 'a b' | replace(' ', '_') }}|{{ nope | default('dflt') }}|{{ '3' | int + 1 }}|{{ 2 | string }}|"
        "{{ messages[0].content is string }}|{{ messages[0] is mapping }}|{{ messages is sequence }}|"
        "{{ messages[0].content is iterable }}|{{ none is none }}|{{ nope is defined }}|{{ 3 is number }}|"
        "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|{{ ['b', 'a'] | sort | join }}|"
        "{{ [3, 1] | max }}|{{ 'x' ~ 1 ~ none }}"
    ),
    "whitespace_control": (
        "{% for m in messages %}\n"
        "    {% if m.role == 'user' %}\n"
        "        U: {{ m.content }}\n"
        "    {%- elif m.role == 'assistant' -%}\n"
        "        A: {{ m.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{#- a comment -#}\n"
        "{% raw %}{{ not rendered }}{% endraw %}\n"
        "{% set block %}inner {{ messages | length }}{% endset %}{{ block | upper }}\n"
        "{% macro tag(name) %}<{{ name }}>{% endmacro %}{{ tag('x') }}{{ tag(name='y') }}\n"
        "{% if add_generation_prompt %}GEN{% elif true %}NOGEN{% else %}never{% endif %}\n"
    ),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    ),
    "content_parts": (
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}{% endfor %}"
        "{% endif %};{% endfor %}"
    ),
    "raise": "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}",
}
PROBE_MESSAGES = {
    "string_methods": [{"role": "user", "content": "  Hello world!  "}],
    "value_printing": [{"role": "user", "content": "x", "n": 2}],
    "tojson_variants": [{
        "role": "user",
        "content": "<é> & 'q' \"dq\" \\ \n\t\u0001 🤗",
        "data": {"b": 1, "a": [1.0, 2.5, 1e-07, 1e16, None, True, False], "float": 0.1, "nested": {"x": {}, "y": []}, "é": "日本"},
    }],
    "dict_methods": [{"role": "user", "content": "x", "data": {"b": 1, "a": "two", "float": 1.5}}],
    "loops_and_namespace": CONVERSATIONS["multi_turn"] + [{"role": "assistant", "content": "Why did..."}, {"role": "user", "content": "Another"}],
    "filters_and_tests": CONVERSATIONS["multi_turn"],
    "whitespace_control": CONVERSATIONS["multi_turn"],
    "generation_tag": CONVERSATIONS["multi_turn"],
    "content_parts": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A cat."},
    ],
    "raise": [{"role": "user", "content": "x"}],
}


def make_tokenizer(template, specials):
    backend = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **specials)


def render(template, specials, case):
    tok = make_tokenizer(template, specials)
    kwargs = dict(case.get("kwargs", {}))
    try:
        text = tok.apply_chat_template(
            case["messages"],
            tools=case.get("tools"),
            documents=case.get("documents"),
            add_generation_prompt=case.get("add_generation_prompt", False),
            continue_final_message=case.get("continue_final_message", False),
            tokenize=False,
            **kwargs,
        )
        return {"text": text}
    except jinja2.exceptions.TemplateError as e:
        return {"raises": str(e)}


def main():
    cases = []
    for template_file, specials in SPECIALS.items():
        with open(os.path.join(DATA, "templates", template_file), encoding="utf-8") as f:
            template = f.read()
        is_llama = template_file.startswith("llama")
        base_kwargs = {"date_string": "26 Jul 2024"} if is_llama else {}
        todo = []
        for name, messages in CONVERSATIONS.items():
            for gen in (True, False):
                todo.append({"name": f"{name}/gen={gen}", "messages": messages, "add_generation_prompt": gen})
        todo.append({
            "name": "continue_final_message",
            "messages": CONVERSATIONS["system_user"] + [{"role": "assistant", "content": "The answer is "}],
            "continue_final_message": True,
        })
        if template_file != "smollm2-instruct.jinja":
            todo.append({"name": "tools", "messages": TOOL_CONVERSATION, "tools": [WEATHER_TOOL], "add_generation_prompt": True})
            todo.append({"name": "tools_no_system", "messages": TOOL_CONVERSATION[1:2], "tools": [WEATHER_TOOL], "add_generation_prompt": True})
        if is_llama:
            todo.append({
                "name": "tools_in_system",
                "messages": TOOL_CONVERSATION[:2],
                "tools": [WEATHER_TOOL],
                "add_generation_prompt": True,
                "kwargs": {"tools_in_user_message": False},
            })
            todo.append({
                "name": "two_tool_calls_raise",
                "messages": [TOOL_CONVERSATION[1], {"role": "assistant", "tool_calls": [TOOL_CALL, TOOL_CALL]}],
                "add_generation_prompt": False,
            })
        if template_file == "llama-3.1-instruct.jinja":
            todo.append({
                "name": "builtin_tools",
                "messages": [
                    {"role": "user", "content": "Search the weather"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "weather Zürich"}}}]},
                    {"role": "ipython", "content": {"result": "sunny"}},
                ],
                "add_generation_prompt": True,
                "kwargs": {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]},
            })
        for case in todo:
            case["kwargs"] = {**base_kwargs, **case.get("kwargs", {})}
            case = {"template": template_file, "special_tokens": specials, **case}
            case.update(render(template, specials, case))
            cases.append(case)

    for name, source in PROBES.items():
        for gen in (True, False):
            case = {
                "name": f"probe/{name}/gen={gen}",
                "template_source": source,
                "special_tokens": PROBE_SPECIALS,
                "messages": PROBE_MESSAGES[name],
                "add_generation_prompt": gen,
                "kwargs": {},
            }
            case.update(render(source, PROBE_SPECIALS, case))
            cases.append(case)

    golden = {
        "produced_by": "scripts/reference/render_chat_templates.py: PreTrainedTokenizerFast.apply_chat_template(tokenize=False)",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
