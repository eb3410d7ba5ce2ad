#!/usr/bin/env python3
"""Writes tests/c/chat_template_cases.h: small templates, each rendered by Jinja2 configured as HF
transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, tojson without ASCII
escaping, raise_exception), for the C unit test. Usage: tools/gen_chat_template_cases.py > tests/c/chat_template_cases.h"""
import json

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

CTX = {"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi ünï ✓"},
                    {"role": "assistant", "content": "<think>x</think>Hello"}],
       "n": 7, "f": 2.5, "s": "Hello World", "l": [3, 1, 2], "d": {"b": 1, "a": [1, {"c": None}]},
       "t": True, "add_generation_prompt": True, "bos_token": "<s>"}

CASES = [
    # literals, printing, arithmetic
    "{{ 1 }} {{ 1.0 }} {{ 1e-5 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }} {{ -n }} {{ - 2 ** 2 }}",
    "{{ [1, 'a', none, true, 2.5] }} {{ (1,) }} {{ {'k': 'v', 'q': \"it's\"} }} {{ d }}",
    "{{ 'tab\\tnl\\nq\\'dq\\\"' }}|{{ '\\u00e9\\x41' }}|{{ 'a' 'b' }}",
    # access and slicing
    "{{ d.b }} {{ d['a'][1].c }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ s[:5] }} {{ s[::-2] }} {{ 'ünïcödé'[1:4] }}",
    "{{ d.missing }}|{{ l[10] }}|{{ d.get('b') }} {{ d.get('z', 0) }} {{ d.items() | list }} {{ d.keys() | list }}",
    # comparisons and logic
    "{{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 2 not in l }} {{ 'a' in d }} {{ 1 == 1.0 }} {{ [1, 2] < [1, 3] }}",
    "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not t }} {{ 'p' if t else 'q' }} [{{ 'p' if not t }}]",
    # tests
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ s is string }} {{ d is mapping }} {{ l is iterable }}"
    " {{ x is defined }} {{ x is undefined }} {{ none is none }} {{ f is float }} {{ n is integer }} {{ t is boolean }}"
    " {{ n is number }} {{ 'abc' is lower }} {{ s is upper }} {{ n is eq 7 }} {{ n is gt 3 }} {{ n is in l }}",
    # filters
    "{{ '  x  ' | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello there' | title }}|{{ 'hELLO' | capitalize }}",
    "{{ l | length }} {{ s | count }} {{ l | first }} {{ l | last }} {{ l | join(',') }} {{ l | sort }} {{ l | sum }}",
    "{{ x | default('dflt') }} {{ '' | default('e', true) }} {{ d | items | list }} {{ d | dictsort }} {{ l | max }}",
    "{{ '3' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 2.675 | round(2) }}",
    "{{ s | replace('o', '0') }} {{ l | reverse | list }} {{ [1, 1, 2] | unique | list }} {{ 'a b  c' | wordcount }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}"
    " {{ messages | rejectattr('role', 'eq', 'system') | list | length }} {{ l | select('odd') | list }}",
    "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'ü\"' | tojson }} {{ d | tojson(sort_keys=true) }}",
    "{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, first=true) }}|{{ '<a>' | e }}|{{ ('<b>' | safe) + '<i>' }}",
    # methods
    "{{ s.split(' ') }} {{ ' a b '.split() }} {{ s.startswith('He') }} {{ s.endswith(('x', 'd')) }} {{ s.lower() }}",
    "{{ '--x--'.strip('-') }} {{ s.replace('l', 'L', 1) }} {{ '-'.join(['a', 'b']) }} {{ s.find('o') }} {{ s.title() }}",
    # statements
    "{% for m in messages %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}:{{ m.role }} {% endfor %}",
    "{% for i in l if i > 1 %}{{ i }}/{{ loop.length }} {% else %}none{% endfor %}{% for i in [] %}x{% else %}E{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for c in 'ab' %}{{ c }}{{ loop.cycle('+', '-') }}{% endfor %}",
    "{% set ns = namespace(c=0) %}{% for i in l %}{% set ns.c = ns.c + i %}{% set local = i %}{% endfor %}{{ ns.c }}{{ local }}",
    "{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}",
    "{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}",
    "{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}",
    "{% set x %}block {{ n }}{% endset %}{{ x }}|{% filter upper %}up{% endfilter %}|{% set a, b = 1, 2 %}{{ a }}{{ b }}",
    "{% raw %}{{ raw }}{% endraw %}{# comment #}",
    # whitespace control, trim_blocks and lstrip_blocks
    "a\n  {% if t %}\n    b\n  {% endif %}\nc\n",
    "a  {%- if t -%}  b  {%- endif -%}  c {{- ' d ' -}} e",
    "x\n    {%+ if t %}y{% endif %}\n{% if t +%}\nz{% endif %}\n  {# c #}\nw",
    # errors
    "{{ raise_exception('Bad role: ' ~ messages[1].role) }}",
    "{{ x.y }}",
    "{{ d.missing.deeper }}",
    "{{ l[10].x }}",
    "{% for m in messages %}{% if loop.index == 2 %}{{ raise_exception('stop at ' ~ loop.index) }}{% endif %}{% endfor %}",
]


def c_string(s):
    out = []
    for b in s.encode():
        if b in (0x22, 0x5c):
            out.append("\\" + chr(b))
        elif b == 0x0a:
            out.append("\\n")
        elif 0x20 <= b < 0x7f and b != 0x3f:  # '?' escaped to avoid trigraphs
            out.append(chr(b))
        else:
            out.append("\\%03o" % b)
    return '"' + "".join(out) + '"'


print("/* chat_template_cases.h - templates and their renderings by Jinja2 %s configured as HF"
      " transformers does;\n * generated by tools/gen_chat_template_cases.py (do not edit). */" % jinja2.__version__)
print("static const char *const chat_template_context_json = %s;" % c_string(json.dumps(CTX, ensure_ascii=False)))
print("static const struct chat_template_case {\n  const char *template_src;\n  const char *output; /* NULL: fails */\n"
      "  const char *error;  /* the message when it fails */\n} chat_template_cases[] = {")
for t in CASES:
    try:
        out, err = env.from_string(t).render(**CTX), None
    except jinja2.exceptions.TemplateError as e:
        out, err = None, str(e)
    print("    {%s,\n     %s,\n     %s}," % (c_string(t), c_string(out) if out is not None else "NULL",
                                            c_string(err) if err is not None else "NULL"))
print("};")
