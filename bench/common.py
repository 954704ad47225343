"""Shared pieces of the benchmarks: machine description, subprocess runs, result files.

Every measured implementation runs in its own fresh Python process (`run_impl`), so peak RSS
(`ru_maxrss`) belongs to that implementation alone and no run warms another's caches. Runs
of the implementations being compared are interleaved, repeat by repeat, and summarised by
medians, so a slow spell of the machine hits every implementation alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OLINGO_PYTHON = sys.executable


def head_commit() -> str:
    """The checked-out commit, short, read from .git's files (no git process is started)."""
    git = BENCH.parent / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:7]
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()[:7]
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:7]
    except OSError:
        pass
    return "unknown"


def machine(run_git: bool = True) -> dict:
    """CPU model, cores, memory, OS, Python and the library versions the numbers belong to;
    `run_git=False` reads the commit from .git's files instead of running git."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for name in ("olingo", "torch", "transformers", "peft", "ray"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    if run_git:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=BENCH).stdout.strip()
    else:
        rev = head_commit()
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1), "os": platform.platform(),
        "python": platform.python_version(), "versions": versions, "git": rev,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Marks:
    """Ends of steps: wall clock and process CPU time (user + system, all threads) at each."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def mark(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    @staticmethod
    def intervals(series: list[float]) -> list[float]:
        """Differences of consecutive marks: one per step after the first mark."""
        return [b - a for a, b in zip(series, series[1:], strict=False)]


def run_impl(python: str | Path, script: Path, spec: dict, workdir: Path, tag: str, env: dict | None = None) -> dict:
    """Run `script --spec S --out R` in a fresh `python` process and return its JSON result;
    `env` adds to (or overrides) the process environment."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent), "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    proc = subprocess.run([str(python), str(script), "--spec", str(spec_path), "--out", str(out_path)],
                          capture_output=True, text=True, env=env, cwd=workdir)
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"{tag}: {script.name} failed (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(out_path.read_text())


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_results(name: str, rows: list[dict], info: dict, markdown: str, out_dir: Path = RESULTS) -> tuple[Path, Path]:
    """<out_dir>/<name>.jsonl (machine line first, then one line per measurement) and .md;
    `out_dir` defaults to bench/results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl, md = out_dir / f"{name}.jsonl", out_dir / f"{name}.md"
    with jsonl.open("w") as handle:
        handle.write(json.dumps({"machine": info}) + "\n")
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    extra = ", ".join(f"{k} {v}" for k, v in info.get("extra_versions", {}).items())
    header = (
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, {info['os']}; "
        f"Python {info['python']}; {versions}" + (f"; {extra}" if extra else "") + f". Commit {info['git']}, {info['date']}.\n\n"
    )
    md.write_text(header + markdown)
    return jsonl, md


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; floats get 3 significant digits."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def runner_main(doc: str, runners: dict, finish) -> None:
    """The command line of a runner script: `--spec S --out R`; seeds, sets threads, runs
    `runners[spec["impl"]]` and writes `finish(spec, output)` as JSON to R."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    import torch

    torch.manual_seed(spec["seed"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    output = runners[spec["impl"]](spec)
    Path(args.out).write_text(json.dumps(finish(spec, output)))
