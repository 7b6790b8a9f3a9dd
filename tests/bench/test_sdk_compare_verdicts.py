"""bench/sdk_compare.py draws no ratio from a run that saw errors, and no verdict from one
round: its reporting, on made-up runs (the smoke run, tests/bench/test_bench_smoke.py, runs
the bench itself)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def sdk_compare():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("sdk_compare", BENCH / "sdk_compare.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def run(rps: float, errors: int = 0, socket: int = 0) -> dict:
    return {"rps": rps, "errors": errors, "socket": socket}


def figures(rps: float, **bad: int) -> dict:
    return (
        {name: run(rps, **bad) for name in ("agent card", "GetTask")}
        | {name: run(rps) for name in ("SendMessage returnImmediately", "echo tasks completed /s")}
        | {"SendMessage blocking (echo)": run(rps)}
    )


def test_a_run_with_non_2xx_answers_voids_the_ratio(sdk_compare):
    ratio, text = sdk_compare.ratio_or_void(run(900, errors=12), run(300))
    assert ratio is None
    assert text == "void: platform: 12 non-2xx"
    ratio, text = sdk_compare.ratio_or_void(run(900), run(300, socket=3))
    assert ratio is None
    assert text == "void: SDK: 3 socket errors"
    ratio, text = sdk_compare.ratio_or_void(run(900), run(300))
    assert ratio == 3.0
    assert text == "3.00x"


def test_one_round_gives_no_verdict_and_void_rounds_are_left_out(sdk_compare, capsys):
    sdk_compare.print_spread([{"platform": figures(400), "sdk": figures(100)}], ["platform", "sdk"])
    out = capsys.readouterr().out
    assert "verdict" not in out.replace("no verdict from 1 valid round(s)", "")
    assert "meets" not in out
    assert "below" not in out

    rounds = [
        {"platform": figures(400), "sdk": figures(100)},
        {"platform": figures(500, errors=7), "sdk": figures(100)},  # void: left out
        {"platform": figures(450), "sdk": figures(100)},
    ]
    sdk_compare.print_spread(rounds, ["platform", "sdk"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  GetTask"))
    assert "platform 400 / 425 / 450 (1 of 3 void)" in line
    assert "ratio 4.00x / 4.25x / 4.50x" in line
    assert "meets in all 2 valid rounds, 1 of 3 void" in line


def test_the_quick_path_figures_are_labelled(sdk_compare):
    assert sdk_compare.label("GetTask") == "GetTask"
    assert sdk_compare.label("agent card") == "agent card"
    for name in (
        "SendMessage returnImmediately",
        "SendMessage blocking (echo)",
        "echo tasks completed /s",
    ):
        assert sdk_compare.label(name) == f"{name} [echo quick path]"
