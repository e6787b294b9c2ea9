"""Sampling profiles of the running services with py-spy, summarized as top entries."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProfileSummary", "start_profiles", "summarize"]

#: Frames from these files are turnlog's own code (py-spy names files relative to sys.path).
_OWN_CODE = ("(turnlog/", "(tools/", "(producers/", "(stream_processors/", "(sinks/", "(schemas/", "/turnlog/")


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    """Top frames by self time (share of samples), and the share whose leaf is turnlog's code."""

    process: str
    samples: int
    own_code_share: float
    top_self: list[tuple[str, float]]


def start_profiles(
    pids: dict[str, int], out_dir: Path, seconds: float
) -> list[tuple[str, Path, subprocess.Popen[bytes]]]:
    """Start ``py-spy record`` (raw collapsed stacks, 100 Hz) on each pid for ``seconds``.

    Raises:
        RuntimeError: py-spy is not installed (``pip install 'turnlog[bench]'``).
    """
    if shutil.which("py-spy") is None:
        raise RuntimeError("py-spy not found: pip install 'turnlog[bench]'")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = []
    for name, pid in pids.items():
        path = out_dir / f"{name}.collapsed.txt"
        command = ["py-spy", "record", "--rate", "100", "--duration", str(int(seconds)), "--format", "raw", "--output",
                   str(path), "--pid", str(pid)]
        started.append((name, path, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return started


def summarize(name: str, path: Path, top: int = 12) -> ProfileSummary:
    """Self time per leaf frame of a collapsed-stacks file (``frame;frame;leaf count`` lines)."""
    leaf: Counter[str] = Counter()
    own = total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        frame = stack.split(";")[-1]
        leaf[frame] += samples
        total += samples
        if any(part in frame for part in _OWN_CODE):
            own += samples
    ranked = [(frame, samples / total) for frame, samples in leaf.most_common(top)] if total else []
    return ProfileSummary(name, total, own / total if total else 0.0, ranked)
