"""How often `math_answer` and `math_verify` give the right verdict on hand-labelled math answers.

Scores every case of bench/math_verify_cases.py (responses in the formats math models write,
each with a verdict by hand) with both built-in verifiers, and writes the accuracy of each
against the labels, how often the two agree, and every case where they disagree, with which
one is right, to bench/results/math_verify.{jsonl,md}. No timing: it runs in seconds on a CPU.

    .venv/bin/python bench/math_verify_agreement.py
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.common import RESULTS, machine, table, write_results  # noqa: E402
from bench.math_verify_cases import CASES, Case  # noqa: E402
from olingo.rewards.math_verify import math_verify  # noqa: E402
from olingo.rewards.verifiers import math_answer  # noqa: E402

CHECKERS = {"math_answer": math_answer, "math_verify": math_verify}


def verdicts(cases: tuple[Case, ...] = CASES) -> list[dict]:
    """One row per case: its label and each checker's verdict (True when it scores 1.0)."""
    rows = []
    for case in cases:
        row = {"name": case.name, "response": case.response, "gt_answer": case.gt_answer, "correct": case.correct}
        row.update({name: fn("", case.response, case.gt_answer) == 1.0 for name, fn in CHECKERS.items()})
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    """Cases, correct verdicts per checker, cases where the two agree."""
    counts = {"cases": len(rows), "agree": sum(r["math_answer"] == r["math_verify"] for r in rows)}
    counts.update({f"{name}_right": sum(r[name] == r["correct"] for r in rows) for name in CHECKERS})
    return counts


def markdown(rows: list[dict], counts: dict) -> str:
    """The accuracy table, then the disagreements and the cases both get wrong."""
    n = counts["cases"]
    lines = [
        f"Hand-labelled answers (bench/math_verify_cases.py): {n} cases, "
        f"{sum(r['correct'] for r in rows)} correct and {sum(not r['correct'] for r in rows)} wrong by hand.\n\n",
        table(
            ["checker", "right verdicts", "accuracy"],
            [[name, f"{counts[f'{name}_right']}/{n}", counts[f"{name}_right"] / n] for name in CHECKERS],
        ),
        f"\nThe two agree on {counts['agree']}/{n} cases ({counts['agree'] / n:.3g}).\n\n",
        "Where they disagree (the label is the hand verdict; 'right' names the checker that matches it):\n\n",
        _case_table([r for r in rows if r["math_answer"] != r["math_verify"]], with_right=True),
        "\nWhere both are wrong:\n\n",
        _case_table([r for r in rows if r["math_answer"] == r["math_verify"] != r["correct"]], with_right=False),
    ]
    return "".join(lines)


def _case_table(rows: list[dict], with_right: bool) -> str:
    if not rows:
        return "(none)\n"
    headers = ["case", "response", "gt_answer", "label", "math_answer", "math_verify"] + (["right"] if with_right else [])
    body = []
    for r in rows:
        cells = [r["name"], _code(r["response"]), _code(r["gt_answer"]), r["correct"], r["math_answer"], r["math_verify"]]
        if with_right:
            cells.append("math_answer" if r["math_answer"] == r["correct"] else "math_verify")
        body.append(cells)
    return table(headers, body)


def _code(text: str) -> str:
    """A cell: the text on one line, in backticks (LaTeX backslashes show as written)."""
    return "`" + " ".join(text.split()).replace("`", "'").replace("|", "\\|") + "`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where math_verify.{jsonl,md} go")
    args = parser.parse_args()
    rows = verdicts()
    counts = summary(rows)
    info = machine(run_git=False)
    info["extra_versions"] = {name: metadata.version(name) for name in ("math-verify", "latex2sympy2_extended", "sympy")}
    jsonl, md = write_results("math_verify", [*rows, {"summary": counts}], info, markdown(rows, counts), args.out_dir)
    print(f"math_answer {counts['math_answer_right']}/{counts['cases']}, math_verify {counts['math_verify_right']}/{counts['cases']}, "
          f"agree {counts['agree']}/{counts['cases']}; wrote {jsonl} and {md}")


if __name__ == "__main__":
    main()
