"""Create (once) and verify the virtual environments the TRL runners use.

    python bench/trl/env.py --which rm|ppo|grpo|dpo|all

Each venv lives under ``bench/.venvs/<name>`` and gets, in this order:

1. ``torch==2.13.0`` alone, first, so pip takes the local CPU wheel (``2.13.0+cpu``); the exact
   version it installed is then written to a constraints file so that no later step can replace it
   with a CUDA build from PyPI;
2. the pinned stack: ``transformers``, ``datasets``, ``accelerate`` and the ``trl`` version of that
   venv, resolved under that constraint.

A stamp file (``.olingo-bench-stamp.json``) records the requirement set; a second call with the same
set installs nothing. ``versions.json`` beside it records the installed versions (a ``pip freeze``
subset) for the results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = ROOT / "bench" / ".venvs"

TORCH = "torch==2.13.0"
COMMON = ["transformers==5.23.0", "datasets==5.2.0", "accelerate==1.15.0"]
# which -> (venv name, trl pin)
VENVS = {
    "rm": ("trl-latest", "trl==1.16.0"),
    "grpo": ("trl-latest", "trl==1.16.0"),
    "dpo": ("trl-latest", "trl==1.16.0"),
    "ppo": ("trl-1.12", "trl==1.12.0"),
}
RECORDED = (
    "torch", "transformers", "datasets", "accelerate", "trl", "tokenizers", "safetensors",
    "huggingface-hub", "numpy", "peft",
)
STAMP = ".olingo-bench-stamp.json"


def _requirements(which: str) -> dict:
    name, trl = VENVS[which]
    return {"name": name, "torch": TORCH, "pins": [*COMMON, trl]}


def venv_path(which: str) -> Path:
    return VENV_DIR / VENVS[which][0]


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _pip(py: Path, *args: str) -> None:
    cmd = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def _refuse_cuda(py: Path, torch_req: str) -> None:
    report = Path(tempfile.mkdtemp(prefix="bench-trl-")) / "report.json"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--dry-run", "--ignore-installed", "--report", str(report), torch_req], check=True)
    items = json.loads(report.read_text()).get("install", [])
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}
    cuda = sorted(n for n in names if n.startswith(("nvidia", "triton", "cuda")))
    if cuda or "+cpu" not in names.get("torch", ""):
        raise RuntimeError(
            f"{torch_req} resolves to torch {names.get('torch')} with {cuda or 'no CPU tag'}: not the local "
            "CPU wheel; refusing to download a CUDA build (put torch-2.13.0+cpu in pip's find-links)"
        )


def _freeze(py: Path) -> dict:
    out = subprocess.run([str(py), "-m", "pip", "freeze", "--disable-pip-version-check"],
                         check=True, capture_output=True, text=True).stdout
    versions = {}
    for line in out.splitlines():
        if "==" in line:
            pkg, ver = line.split("==", 1)
            if pkg.lower().replace("_", "-") in RECORDED:
                versions[pkg.lower().replace("_", "-")] = ver
    return versions


def versions(which: str) -> dict:
    """Installed versions recorded when the venv was built ({} if it was not)."""
    path = venv_path(which) / "versions.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ensure_venv(which: str, verbose: bool = True) -> Path:
    """Create the venv for ``which`` ('rm', 'ppo', 'grpo' or 'dpo') if needed; return its python."""
    req = _requirements(which)
    venv = venv_path(which)
    py = _python(venv)
    stamp = venv / STAMP
    if py.exists() and stamp.exists() and json.loads(stamp.read_text()).get("req") == req:
        return py
    t0 = time.perf_counter()
    if verbose:
        print(f"[bench/trl] building {venv} ({', '.join(req['pins'])})", file=sys.stderr, flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # 1. torch alone: the local CPU wheel. Resolve first (dry run) and refuse a CUDA build, which
    #    would drag in GBs of nvidia-* wheels.
    _refuse_cuda(py, req["torch"])
    _pip(py, req["torch"])
    torch_ver = _freeze(py).get("torch")
    if torch_ver is None:
        raise RuntimeError("torch did not install")
    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={torch_ver}\n")
    # 2. the rest, unable to touch torch.
    _pip(py, "-c", str(constraints), *req["pins"])
    # 3. verify: imports work, torch is the CPU build, no CUDA runtime got pulled in.
    check = (
        "import torch, transformers, datasets, accelerate, trl, json;"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda,"
        " 'trl': trl.__version__, 'transformers': transformers.__version__}))"
    )
    info = json.loads(subprocess.run([str(py), "-c", check], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    if info["cuda"] is not None:
        raise RuntimeError(f"{venv}: torch is a CUDA build ({info}); expected the CPU wheel")
    found = _freeze(py)
    nvidia = [p for p in subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True,
                                        text=True).stdout.splitlines() if p.lower().startswith("nvidia")]
    if nvidia:
        raise RuntimeError(f"{venv}: CUDA packages got installed: {nvidia}")
    (venv / "versions.json").write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    stamp.write_text(json.dumps({"req": req, "install_s": round(time.perf_counter() - t0, 1)}) + "\n")
    if verbose:
        print(f"[bench/trl] {venv.name} ready in {time.perf_counter() - t0:.0f}s: {found}",
              file=sys.stderr, flush=True)
    return py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--which", choices=["rm", "ppo", "grpo", "dpo", "all"], default="all")
    args = ap.parse_args()
    whiches = ["rm", "ppo"] if args.which == "all" else [args.which]
    out = {}
    for which in whiches:
        py = ensure_venv(which)
        out[which] = {"python": str(py), "versions": versions(which)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
