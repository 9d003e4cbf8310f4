# ruff: noqa: RUF001, RUF003  (DeepSeek's markers are written with fullwidth bars)
"""Every model family's tool-call convention, and the one a chat template teaches.

A family is a ToolCallFormat: either JSON call objects after a marker (read by
parser.py), or a layout (layouts.py: a name then JSON, XML-like parameters, Python-like
calls) parameterised by the family's markers (read by marked.py). The template is
matched by the markers its source writes; the first entry that matches wins, so the
more specific markers come first.
"""

from __future__ import annotations

from edge_server.api.openai.chat.tool_parsers.formats import (
    HERMES,
    LLAMA3,
    MISTRAL,
    TOOL_CALL_TOKEN,
    ToolCallFormat,
)
from edge_server.api.openai.chat.tool_parsers.layouts import (
    NamedJson,
    Pythonic,
    XmlParameters,
    gemma_arguments,
)

_JSON_BLOCK = "[{call}]"

# JSON call objects after a family's own marker --------------------------------------

# `<|START_ACTION|>[{"tool_call_id": …, "tool_name": …, "parameters": …}]<|END_ACTION|>`
COMMAND_R7B = ToolCallFormat(
    "command_r7b", starts=("<|START_ACTION|>",), ends=("<|END_ACTION|>",),
    think=("<|START_THINKING|>", "<|END_THINKING|>"),
    forced="<|START_ACTION|>" + _JSON_BLOCK + "<|END_ACTION|>",
)
# "Action:\n```json\n[{"tool_name": …, "parameters": …}]\n```"
COMMAND_R_PLUS = ToolCallFormat(
    "command_r_plus", starts=("Action:\n```json",), ends=("```",),
    forced="Action:\n```json\n" + _JSON_BLOCK + "\n```",
)
NEMOTRON_V2 = ToolCallFormat(
    "nemotron_v2", starts=("<TOOLCALL>",), ends=("</TOOLCALL>",),
    forced="<TOOLCALL>" + _JSON_BLOCK + "</TOOLCALL>",
)
APRIEL = ToolCallFormat(
    "apriel", starts=("<tool_calls>",), ends=("</tool_calls>",),
    think=("Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]"),
    forced="<tool_calls>" + _JSON_BLOCK + "</tool_calls>",
)
GIGACHAT_3_1 = ToolCallFormat(
    "gigachat3.1", starts=("<|function_call|>",), forced="<|function_call|>{call}"
)
GIGACHAT_3 = ToolCallFormat(
    "gigachat3", starts=("<|message_sep|>\n\nfunction call<|role_sep|>",),
    forced="<|message_sep|>\n\nfunction call<|role_sep|>\n{call}",
)
FIREFUNCTION = ToolCallFormat(
    "firefunction", starts=("functools",), forced="functools" + _JSON_BLOCK
)

# Layouts ------------------------------------------------------------------------------

_XML_PARAM = "<parameter={key}>\n{value}\n</parameter>\n"

# `<tool_call><function=name><parameter=k>v</parameter></function></tool_call>`
QWEN3_CODER = ToolCallFormat(
    "qwen3_coder",
    layout=XmlParameters(
        start=r"<tool_call>", end="</tool_call>", open=r"<function=(?P<name>[^>\n]+)>",
        close="</function>", parameter=r"<parameter=(?P<key>[^>\n]+)>",
        parameter_end="</parameter>",
    ),
    trigger=r"<tool_call>|<function=",
    forced="<tool_call>\n{calls}</tool_call>",
    forced_call="<function={name}>\n{params}</function>\n", forced_param=_XML_PARAM,
)
SEED_OSS = ToolCallFormat(
    "seed_oss",
    layout=XmlParameters(
        start=r"<seed:tool_call>", end="</seed:tool_call>",
        open=r"<function=(?P<name>[^>\n]+)>", close="</function>",
        parameter=r"<parameter=(?P<key>[^>\n]+)>", parameter_end="</parameter>",
    ),
    trigger=r"<seed:tool_call>|<function=",
    think=("<seed:think>", "</seed:think>"),
    forced="<seed:tool_call>\n{calls}</seed:tool_call>",
    forced_call="<function={name}>\n{params}</function>\n",
    forced_param="<parameter={key}>{value}</parameter>\n",
)
# `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`
GLM = ToolCallFormat(
    "glm",
    layout=XmlParameters(
        start=r"<tool_call>", end="</tool_call>", open=r"(?P<name>[^\s<]+)(?=\s|<)",
        parameter=r"<arg_key>(?P<key>[^<]*)</arg_key>\s*<arg_value>",
        parameter_end="</arg_value>",
    ),
    trigger=r"<tool_call>",
    forced="<tool_call>{calls}</tool_call>", forced_call="{name}\n{params}",
    forced_param="<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n",
)
MINIMAX_M2 = ToolCallFormat(
    "minimax_m2",
    layout=XmlParameters(
        start=r"<minimax:tool_call>", end="</minimax:tool_call>",
        open=r'<invoke name="(?P<name>[^"]+)">', close="</invoke>",
        parameter=r'<parameter name="(?P<key>[^"]+)">', parameter_end="</parameter>",
    ),
    trigger=r"<minimax:tool_call>",
    forced="<minimax:tool_call>\n{calls}</minimax:tool_call>",
    forced_call='<invoke name="{name}">\n{params}</invoke>\n',
    forced_param='<parameter name="{key}">{value}</parameter>\n',
)
_M3_SEP = "]<]minimax[>["
MINIMAX_M3 = ToolCallFormat(
    "minimax_m3",
    layout=XmlParameters(
        start=r"<tool_call>", end="</tool_call>", noise=(_M3_SEP,),
        open=r'<invoke name="(?P<name>[^"]+)">', close="</invoke>",
        parameter=r"<(?P<key>[^/>\s][^>\s]*)>", parameter_end="</{key}>",
    ),
    trigger=r"<tool_call>", drops=(_M3_SEP,), think=("<mm:think>", "</mm:think>"),
)


def _dsml(block: str) -> ToolCallFormat:
    """DeepSeek V3.2 (`function_calls`) and V4 (`tool_calls`) markup."""
    return ToolCallFormat(
        f"dsml_{block}",
        layout=XmlParameters(
            start=f"<｜DSML｜{block}>", end=f"</｜DSML｜{block}>",
            open=r'<｜DSML｜invoke name="(?P<name>[^"]+)">', close="</｜DSML｜invoke>",
            parameter=r'<｜DSML｜parameter name="(?P<key>[^"]+)"[^>]*>',
            parameter_end="</｜DSML｜parameter>",
        ),
        trigger=f"<｜DSML｜{block}>",
        forced=f"<｜DSML｜{block}>\n{{calls}}</｜DSML｜{block}>",
        forced_call='<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>\n',
        forced_param='<｜DSML｜parameter name="{key}">{value}</｜DSML｜parameter>\n',
    )


DSML_V32, DSML_V4 = _dsml("function_calls"), _dsml("tool_calls")
MINICPM5 = ToolCallFormat(
    "minicpm5",
    layout=XmlParameters(
        open=r'<function name="(?P<name>[^"]+)">', close="</function>",
        parameter=r'<param name="(?P<key>[^"]+)">', parameter_end="</param>",
    ),
    trigger=r'<function name="',
    forced="{calls}", forced_call='<function name="{name}">{params}</function>',
    forced_param='<param name="{key}">{value}</param>',
)
# Its answer starts after `<|start|>assistant`, at ` to=…<|message|>`.
MUSE_GLIMMER = ToolCallFormat(
    "muse_glimmer",
    layout=XmlParameters(
        start=r"(?:<\|start\|>assistant)?(?: to=[^<\s]+<\|message\|>)?\s*"
        r"<atem:function_calls>",
        end="</atem:function_calls>",
        open=r'<atem:invoke name="(?P<name>[^"]+)">', close="</atem:invoke>",
        parameter=r'<atem:parameter name="(?P<key>[^"]+)">', parameter_end="</atem:parameter>",
    ),
    trigger=r"(?:<\|start\|>assistant)?(?: to=(?!user)[^<\s]+<\|message\|>)?\s*"
    r"<atem:function_calls>",
    drops=(" to=user<|message|>", "<|eot|>", "<|eom|>", "<|start|>assistant"),
)
KIMI_K3 = ToolCallFormat(
    "kimi_k3",
    layout=XmlParameters(
        start=r"<\|open\|>tools<\|sep\|>", end="<|close|>tools<|sep|>",
        open=r'<\|open\|>call tool="(?P<name>[^"]+)"[^<]*<\|sep\|>', close="<|close|>call<|sep|>",
        parameter=r'<\|open\|>argument key="(?P<key>[^"]+)"[^<]*<\|sep\|>',
        parameter_end="<|close|>argument<|sep|>",
    ),
    trigger=r"<\|open\|>tools<\|sep\|>",
    drops=("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>"),
    think=("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
)
KIMI_K2 = ToolCallFormat(
    "kimi_k2",
    layout=NamedJson(
        start=r"<\|tool_calls_section_begin\|>", end="<|tool_calls_section_end|>",
        opens=(r"<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[^\s:<]+)(?::\d+)?\s*"
               r"<\|tool_call_argument_begin\|>",),
        closes=("<|tool_call_end|>",),
    ),
    trigger=r"<\|tool_calls_section_begin\|>|<\|tool_call_begin\|>",
    forced="<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>",
    forced_call="<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{args}"
    "<|tool_call_end|>",
)
# R1: `…begin｜>function<｜tool▁sep｜>name\n```json\n{…}```…`;
# V3.1: `…begin｜>name<｜tool▁sep｜>{…}`.
DEEPSEEK = ToolCallFormat(
    "deepseek",
    layout=NamedJson(
        start=r"<｜tool▁calls▁begin｜>", end="<｜tool▁calls▁end｜>",
        opens=(r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n<]+)\n```json\n",
               r"<｜tool▁call▁begin｜>(?P<name>[^<]+)<｜tool▁sep｜>"),
        closes=("```", "<｜tool▁call▁end｜>"),
    ),
    trigger=r"<｜tool▁calls▁begin｜>|<｜tool▁call▁begin｜>",
    forced="<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>",
    forced_call="<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>",
)
# gpt-oss: `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{…}<|call|>`
_HARMONY_CALL = (r"(?:<\|start\|>assistant)?(?:<\|channel\|>(?:commentary|analysis))?\s*"
                 r"to=functions\.")
HARMONY = ToolCallFormat(
    "harmony",
    layout=NamedJson(
        opens=(_HARMONY_CALL + r"(?P<name>[^\s<]+)\s*(?:<\|channel\|>[^<]*)?"
               r"(?:<\|constrain\|>[^<]*)?<\|message\|>",),
        closes=("<|call|>",),
    ),
    trigger=_HARMONY_CALL,
    drops=("<|channel|>final<|message|>", "<|start|>assistant", "<|return|>"),
    think=("<|channel|>analysis<|message|>", "<|end|>"),
    forced="{calls}",
    forced_call="<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
    "<|call|>",
)
FUNCTIONARY_V3_1 = ToolCallFormat(
    "functionary_v3.1",
    layout=NamedJson(opens=(r"<function=(?P<name>[^>\n]+)>",), closes=("</function>",)),
    trigger=r"<function=",
    forced="{calls}", forced_call="<function={name}>{args}</function>",
)
# `name\n{…}` after `>>>` (the prompt writes the first one); `all\n` opens plain text.
FUNCTIONARY_V3_2 = ToolCallFormat(
    "functionary_v3.2",
    layout=NamedJson(opens=(r"(?:>>>)?(?!all\n)(?P<name>[\w.\-]+)\n",)),
    trigger=r">>>(?!all\n)", drops=(">>>all\n",), opening=r"all\n|(?=[\w.\-]+\n)",
    forced="{calls}", forced_call="{name}\n{args}",
)
APERTUS = ToolCallFormat(
    "apertus",
    layout=NamedJson(
        start=r"<\|tools_prefix\|>\s*\[", end="]<|tools_suffix|>", separators=",",
        opens=(r'\{\s*"(?P<name>[^"]+)"\s*:',), closes=("}",),
    ),
    trigger=r"<\|tools_prefix\|>",
    forced="<|tools_prefix|>[{calls}]<|tools_suffix|>", forced_call='{"{name}": {args}}',
)
GEMMA4 = ToolCallFormat(
    "gemma4",
    layout=NamedJson(
        opens=(r"<\|tool_call>\s*call:(?P<name>[^{\s]+)(?=\{)",), closes=("<tool_call|>",),
        arguments=gemma_arguments,
    ),
    trigger=r"<\|tool_call>",
    think=("<|channel>thought", "<channel|>"),
)
LFM2 = ToolCallFormat(
    "lfm2",
    layout=Pythonic(start=r"<\|tool_call_start\|>", end="<|tool_call_end|>"),
    trigger=r"<\|tool_call_start\|>",
)

# Template markers, most specific first ------------------------------------------------

_BY_MARKER: tuple[tuple[tuple[str, ...], ToolCallFormat], ...] = (
    (("<|channel|>",), HARMONY),
    (("｜DSML｜", "function_calls"), DSML_V32),
    (("｜DSML｜",), DSML_V4),
    (("tool▁call▁begin",), DEEPSEEK),
    (("<|tool_call_begin|>",), KIMI_K2),
    (("<|open|>",), KIMI_K3),
    (("seed:tool_call",), SEED_OSS),
    (("minimax:tool_call",), MINIMAX_M2),
    (("]<]minimax[>[",), MINIMAX_M3),
    (("<arg_key>",), GLM),
    (("<parameter=",), QWEN3_CODER),
    (("<function name=",), MINICPM5),
    (("atem:",), MUSE_GLIMMER),
    (("<|tool_call>",), GEMMA4),
    (("<|tool_call_start|>",), LFM2),
    (("<|tool_list_start|>",), LFM2),
    (("tools_prefix",), APERTUS),
    ((">>>",), FUNCTIONARY_V3_2),
    (("<|START_ACTION|>",), COMMAND_R7B),
    (("Action:",), COMMAND_R_PLUS),
    (("TOOLCALL",), NEMOTRON_V2),
    (("<tool_calls>",), APRIEL),
    (("<|function_call|>",), GIGACHAT_3_1),
    (("<|role_sep|>",), GIGACHAT_3),
    (("functools",), FIREFUNCTION),
    (("[TOOL_CALLS]",), MISTRAL),
    (("<function=",), FUNCTIONARY_V3_1),
    (("<tool_call>",), HERMES),
    (("<|tool_call|>",), TOOL_CALL_TOKEN),
    (("<|python_tag|>",), LLAMA3),
    (("<|start_header_id|>ipython",), LLAMA3),
)


def format_for_template(source: str, renders_tools: bool = True) -> ToolCallFormat:
    """The convention the template's markers name, also where the template only writes
    past calls and not the tools (DeepSeek R1 and V3.1: the model was trained on its
    own convention); Hermes for templates that name no marker (the generic tool prompt
    asks for it)."""
    for markers, fmt in _BY_MARKER:
        if all(m in source for m in markers):
            return fmt
    return HERMES


def think_markers(source: str) -> tuple[str, str]:
    """Where the template's model opens and closes its reasoning."""
    for markers, fmt in _BY_MARKER:
        if all(m in source for m in markers):
            return fmt.think
    for fmt in (MISTRAL, SEED_OSS, COMMAND_R7B, MINIMAX_M3, GEMMA4, KIMI_K3):
        if fmt.think[0] in source:
            return fmt.think
    return HERMES.think
