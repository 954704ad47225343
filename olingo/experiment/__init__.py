"""Experiments: arms x repeats x continual stages of olingo runs, benchmarks, and results.

```python
from olingo.experiment import Experiment
result = Experiment.from_yaml("olingo/configs/experiment_sft_lr.yaml").run()
print(result.best_arm, result.conclusion)
```

See docs/experiments.md for the config, the run order and the files an experiment writes.
The names load on first use, so loggers can import `olingo.experiment.results` (plain
dataclasses) without pulling in the recipes.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Experiment": "olingo.experiment.runner",
    "run_experiment": "olingo.experiment.runner",
    "ExperimentConfig": "olingo.experiment.config",
    "BenchmarkSpec": "olingo.experiment.config",
    "MatrixSpec": "olingo.experiment.config",
    "ContinualStage": "olingo.experiment.config",
    "RunPlan": "olingo.experiment.config",
    "plan_runs": "olingo.experiment.config",
    "ArithmeticBenchmark": "olingo.experiment.benchmarks",
    "build_benchmark": "olingo.experiment.benchmarks",
    "EvalResult": "olingo.experiment.results",
    "RunResult": "olingo.experiment.results",
    "ArmResult": "olingo.experiment.results",
    "ExperimentResult": "olingo.experiment.results",
    "LocalLogger": "olingo.experiment.local_logger",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'olingo.experiment' has no attribute {name!r}")
