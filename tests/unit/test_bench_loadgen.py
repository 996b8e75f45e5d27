"""The benchmark's load shapes (bench/loadgen.py): the lab's bursts and issue 18's sustained
overload keep the offered load they claim."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import loadgen as lg  # noqa: E402


def _mean(phase: lg.Phase, step: float = 0.01) -> float:
    ticks = int((phase.end - phase.start) / step)
    return sum(lg.rate_at(phase, phase.start + i * step) for i in range(ticks)) / ticks


def test_the_burst_phase_is_unchanged() -> None:
    burst = lg.Phase("burst", 0, 120, 1.35, burst=True)
    assert burst.peak_load == pytest.approx(1.875)
    assert [lg.rate_at(burst, t) for t in (0, 11.9, 12.1, 19.9, 20.1)] == [1.0, 1.0, 1.875, 1.875, 1.0]
    assert _mean(burst) == pytest.approx(1.35, abs=0.01)


def test_the_sustained_overload_is_145_percent_with_3x_bursts_every_lab_minute() -> None:
    sustained = lg.Phase("sustained", 300, 396, 1.45, burst=True, cycle=24.0, peak=8.0, base=0.675)
    assert sustained.peak_load == pytest.approx(3.0)
    assert _mean(sustained) == pytest.approx(1.45, abs=0.01)
    plan = lg.schedule([sustained], capacity_rps=10.0, seed=8, mean_tokens=342)
    offered = len(plan) / (96 * 10.0)
    assert offered == pytest.approx(1.45, rel=0.08)
    assert sum(p.high for p in plan) / len(plan) == pytest.approx(0.3, abs=0.04)  # 70 % batch
