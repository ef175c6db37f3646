"""What README.md and docs/ claim that can be checked without a model: measured figures against
the benchmark's JSON, commands against what the tests run, links and file paths against the
repository. (Which routes need no key: tests/api/test_documented_routes_http.py.)
"""

from __future__ import annotations

import inspect
import json
import re
import shlex
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.test_deploy import VLLM_FLAGS, flags
from tests.upstreams import vllm_server

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("api/*.md"))
"""Every page of docs/, the reference's pages under docs/api/ included."""


def _name(page: Path) -> str:
    """A page's test id: its path under docs/ (`api/chat.md`), or `README.md`."""
    return str(page.relative_to(ROOT / "docs")) if page.parent != ROOT else page.name
GATEWAYS = ROOT / "docs" / "gateways.json"

# -- the gateway's CPU per relayed token: quoted only in tables checked against their JSON ------

COLUMNS = {"tokenwire": "tokenwire", "smg": "smg", "vllm-router": "vllm-router",
           "bare Python relay": "python floor"}
"""The README table's columns, and the names bench/gateways.py records them under."""
ROWS = {"CPU ms / token, 1 stream": "streamed chat, 1 stream",
        "CPU ms / token, 8 streams": "streamed chat, 8 streams",
        "CPU ms / token, whole `n: 8` rollouts with logprobs": "whole rollouts, n=8 with logprobs"}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs if r.get(key) is not None)


def _speed_section() -> str:
    text = README.read_text()
    start = text.index("### In front of vLLM: what the gateway costs")
    return text[start:text.index("\n## ", start)]


def _table(section: str) -> dict[str, dict[str, str]]:
    """The section's table: row label -> column name -> cell."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:], strict=True))
    return rows


def _number(cell: str) -> float:
    return float(re.match(r"~?([\d.]+)", cell).group(1))  # type: ignore[union-attr]


def test_the_gateway_figures_are_the_benchmarks_json() -> None:
    """Every figure of the README's gateway table (and the ratios its text draws from them) is
    the median docs/gateways.json holds, as bench/gateways.py prints it: a rerun that rewrites
    the JSON must rewrite the table."""
    bench = json.loads(GATEWAYS.read_text())
    section = _speed_section()
    table = _table(section)
    assert f"Medians of {bench['rounds']} rounds" in section
    cpu = {w: {name: _median(runs, "cpu_ms_per_token") for name, runs in per.items()
               if name != "direct"} for w, per in bench["vllm"].items()}
    for label, workload in ROWS.items():
        for column, name in COLUMNS.items():
            cell = table[label][column]
            assert _number(cell) == pytest.approx(round(cpu[workload][name], 3), abs=1e-9), \
                f"{label} / {column}: {cell} != {cpu[workload][name]:.3f} (docs/gateways.json)"
    one, eight = (bench["vllm"][ROWS[f"CPU ms / token, {n}"]] for n in ("1 stream", "8 streams"))
    label = next(r for r in table if r.startswith("TTFT"))
    direct = f"vLLM direct: {_median(one['direct'], 'ttft_ms'):.1f} / " \
             f"{_median(eight['direct'], 'ttft_ms'):.1f} ms"
    assert direct in label
    for column, name in COLUMNS.items():
        assert table[label][column] == f"{_median(one[name], 'ttft_ms'):.1f} / " \
                                       f"{_median(eight[name], 'ttft_ms'):.1f} ms", column
    relay = bench["relay"]["relayed, 16 streams"]
    label = next(r for r in table if r.startswith("relay ceiling"))

    def k(name: str) -> str:
        return f"{_median(relay[name], 'tokens_per_s') / 1000:.1f}k"

    assert f"direct from the stub: {k('direct')}" in label
    for column, name in COLUMNS.items():
        assert table[label][column].startswith(k(name)), column
    assert f"`--workers 2`: {k('tokenwire x2')}" in table[label]["tokenwire"]
    # the ratios the text draws
    prose = " ".join(section.split())
    floor = {w: cpu[w]["python floor"] for w in cpu}
    streamed = [w for w in cpu if w.startswith("streamed")]
    assert f"tokenwire costs {cpu[streamed[0]]['tokenwire'] / floor[streamed[0]]:.1f}x the floor " \
           f"(one stream) and {cpu[streamed[1]]['tokenwire'] / floor[streamed[1]]:.1f}x " \
           "(eight)" in prose
    assert f"costs {floor[streamed[0]] / cpu[streamed[0]]['vllm-router']:.0f}x vllm-router's" \
        in prose
    ratios = [statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                for a, b in zip(per[name], per["direct"], strict=True))
              for w in streamed for per in [bench["vllm"][w]] for name in per if name != "direct"]
    assert f"relays {min(ratios):.2f}-{max(ratios):.2f}x of direct" in prose


def _cpu_per_token_paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text)
            if "CPU" in p and re.search(r"per\s+(relayed\s+|streamed\s+)?token", p)
            and re.search(r"\b\d*\.\d+\s*ms\b", p)]


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_no_other_page_states_a_cpu_per_token_figure(doc: Path) -> None:
    """No paragraph of docs/ quotes a CPU-per-token figure in prose (three pages once gave three
    different ones): figures stand in the tables checked against their JSON (the README's,
    hot-path.md's, capacity.md's), and prose that works from them says "CPU ms a token"."""
    assert _cpu_per_token_paragraphs(doc.read_text()) == []


def test_the_figure_check_sees_a_quoted_figure() -> None:
    assert _cpu_per_token_paragraphs("bench/gateways.py measures 0.10\nms of gateway CPU per "
                                     "token streamed from vLLM")


# -- commands ---------------------------------------------------------------------------------


def _sh_commands(page: Path) -> list[tuple[list[str], list[str]]]:
    """Each tokenwire, python or vLLM command of a page's sh blocks, continuation lines joined:
    its environment assignments and its words (a trailing `&` left out)."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not re.match(r"(?:[A-Z_]+=\S+\s+)*(?:tokenwire|python|vllm)\s", line):
                continue  # (curl with a JSON body over several lines, ...)
            words = [w for w in shlex.split(line, comments=True) if w != "&"]
            n = next((i for i, w in enumerate(words) if not re.match(r"[A-Z_]+=", w)), 0)
            if words[n:]:
                out.append((words[:n], words[n:]))
    return out


def _starts_vllm(words: list[str]) -> bool:
    return words[:2] == ["vllm", "serve"] or "vllm.entrypoints.openai.api_server" in words


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "fleet.md", ROOT / "docs" / "rl.md"],
                         ids=_name)
def test_vllm_is_started_as_the_tests_start_it(page: Path) -> None:
    """The pages that put tokenwire in front of vLLM for the control plane start vLLM with its
    RL endpoints on (VLLM_SERVER_DEV_MODE=1) and its token endpoint (--enable-scale-out), as
    tests/upstreams starts the vLLM the tests run; and with flags vLLM has (the deploy files'
    and those the tests pass to real vLLM)."""
    source = inspect.getsource(vllm_server)
    assert '"VLLM_SERVER_DEV_MODE": "1"' in source and '"--enable-scale-out"' in source
    known = VLLM_FLAGS | set(re.findall(r'"(--[a-z][\w-]*)"', source))
    commands = [(env, words) for env, words in _sh_commands(page) if _starts_vllm(words)]
    assert commands
    for env, words in commands:
        assert "VLLM_SERVER_DEV_MODE=1" in env, words
        assert "--enable-scale-out" in words, words
        assert flags(words) <= known, words


@pytest.mark.parametrize("page", [README, *DOCS], ids=_name)
def test_the_commands_a_page_shows_parse(page: Path) -> None:
    """`tokenwire ...` as tokenwire's own CLI parses it, and `python docs/examples/X.py ...` with
    flags the example defines."""
    from tokenwire.cli import _parser

    for _, words in _sh_commands(page):
        if words[0] == "tokenwire":
            _parser().parse_args(words[1:])  # exits on a flag or command tokenwire lacks
        elif words[0] == "python" and words[1].startswith("docs/examples/"):
            script = (ROOT / words[1]).read_text()
            defined = set(re.findall(r'add_argument\("(--[\w-]+)"', script))
            assert flags(words) <= defined, " ".join(words)


# -- links and paths --------------------------------------------------------------------------

PAGES = [README, *DOCS]
LINK = re.compile(r"\]\(([^)#\s]*)(#[^)\s]*)?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (fenced code left out)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_links_lead_somewhere(page: Path) -> None:
    """Every relative link names a file of the repository, and a heading that page has."""
    broken = []
    for target, anchor in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor[1:] not in _anchors(path):
            broken.append(target + anchor)
    assert broken == []


OURS = re.compile(r"(?<![\w/.-])((?:src/tokenwire|tests|bench|scripts|deploy|docs/examples)/"
                  r"[\w./-]*[\w/])")
"""A path into this repository (other projects' paths, `vllm/...`, are not ours to check)."""
PACKAGE = re.compile(r"(?<![\w/.-])((?:server|serving|engines|tokenizers|storage|protocol|client|"
                     r"rl)/[\w./-]*\.py)")
"""A module named from the package, `engines/upstream/migration.py`."""


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_files_a_page_names_exist(page: Path) -> None:
    text = page.read_text()
    missing = [p for p in OURS.findall(text) if not (ROOT / p).exists()]
    missing += [p for p in PACKAGE.findall(text) if not (ROOT / "src" / "tokenwire" / p).exists()]
    assert missing == []


def test_the_concurrency_sweep_tables_are_its_json() -> None:
    """docs/hot-path.md's sweep tables are docs/sweep.json's medians (bench/sweep.py `table`,
    the function that printed them)."""
    from bench._sweep_report import table

    sweep = json.loads((ROOT / "docs" / "sweep.json").read_text())
    text = (ROOT / "docs" / "hot-path.md").read_text()
    for line in table(sweep).splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            assert line in text, line


def test_the_capacity_figures_are_the_sweeps_json() -> None:
    """docs/capacity.md's table is tokenwire's medians in the JSON each row names (bench/sweep.py),
    its tokens/s a busy core 1,000 / the CPU ms a token; its idle memory the sweep's range."""
    from bench._sweep_report import med

    text = (ROOT / "docs" / "capacity.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(("| whole rollouts |", "| streams |"))]
    assert len(rows) >= 4
    for workload, level, cpu, per_core, rss, source in rows:
        kind = "whole" if workload == "whole rollouts" else "stream"
        runs = json.loads((ROOT / source).read_text())[kind][level]["tokenwire"]
        ms = med(runs, "cpu_ms_per_token")
        assert (cpu, rss) == (f"{ms:.4f}", f"{med(runs, 'rss_bytes_per_token_in_flight'):.0f}"), \
            (workload, level)
        assert per_core == f"{round(1000 / ms, -2):,.0f}", (workload, level)
    sweep = json.loads((ROOT / "docs" / "sweep.json").read_text())
    for name, words in (("tokenwire", "one worker"),
                        ("tokenwire x2", "two workers with their supervisor")):
        idle = [r["idle_rss_mb"] for kind in ("whole", "stream") for per in sweep[kind].values()
                for r in per[name]]
        assert f"{words} {min(idle):.0f}-{max(idle):.0f} MB" in " ".join(text.split()), name


def test_the_hot_path_figures_are_its_benchmarks_json() -> None:
    """docs/hot-path.md's table is docs/hot-path.json's medians (bench/gateways.py --paced-ms)."""
    bench = json.loads((ROOT / "docs" / "hot-path.json").read_text())
    text = (ROOT / "docs" / "hot-path.md").read_text()
    header = next(ln for ln in text.splitlines() if ln.startswith("| CPU ms / token |"))
    names = [c.strip() for c in header.strip("|").split("|")][1:]
    for workload, per in bench["paced"].items():
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {workload} |"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells == [f"{_median(per[n], 'cpu_ms_per_token'):.3f}" for n in names], workload
