"""DeepSeek's formats, in its fullwidth control tokens (vLLM's `deepseek_v3` and `deepseek_v31`
parsers; xgrammar's `deepseek_r1` and `deepseek_v3_1` structural tags):
- V3 and R1 (and R1's distills): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>`
  name, then the arguments fenced as ```json, `<｜tool▁call▁end｜>`, more calls a newline apart,
  `<｜tool▁calls▁end｜>`;
- V3.1 on: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, no type, no fence."""

from __future__ import annotations

from .format import ToolFormat

__all__ = ["DEEPSEEK_V3", "DEEPSEEK_V31"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

DEEPSEEK_V3 = ToolFormat(
    name="deepseek_v3", sign=CALLS_BEGIN, triggers=(CALLS_BEGIN,),
    open_re=CALLS_BEGIN + r"\s*",
    head_re=CALL_BEGIN + "function" + SEP + r"(?P<name>[^\n<]+)\n```json\n",
    tail_re=r"\s*```\s*" + CALL_END, sep_re=r"\s*", close_re=r"\s*" + CALLS_END,
    begin=lambda name: f"{CALL_BEGIN}function{SEP}{name}\n```json\n",
    end=f"\n```{CALL_END}", separator="\n", section=(CALLS_BEGIN, CALLS_END),
    args_end=CALL_END, json_name=False, json_wrapped=False)

DEEPSEEK_V31 = ToolFormat(
    name="deepseek_v31", sign=f"{CALL_BEGIN}'+ tool['function']['name'] + '{SEP}",
    triggers=(CALLS_BEGIN,), open_re=CALLS_BEGIN + r"\s*",
    head_re=CALL_BEGIN + r"(?P<name>[^<]+)" + SEP, tail_re=r"\s*" + CALL_END, sep_re=r"\s*",
    close_re=r"\s*" + CALLS_END, begin=lambda name: f"{CALL_BEGIN}{name}{SEP}", end=CALL_END,
    separator="", section=(CALLS_BEGIN, CALLS_END), args_end=CALL_END, json_name=False,
    json_wrapped=False)
