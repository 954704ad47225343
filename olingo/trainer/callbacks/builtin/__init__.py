"""Built-in callbacks, registered by name for `build_callback({"kind": ..., "params": ...})`.

| kind (aliases)                     | class               | writes (under the run directory)                     |
|------------------------------------|---------------------|------------------------------------------------------|
| `jsonl_metrics`                    | `JsonlMetrics`      | `metrics.jsonl`: the run's metrics log (docs/callbacks.md) |
| `csv_metrics`                      | `CsvMetrics`        | `metrics.csv` (train rows), `metrics_eval.csv` (eval); experiments: `results.csv` |
| `tensorboard_logger` (`tensorboard`) | `TensorBoardLogger` | `tb/events.out.tfevents.*`; experiments: `<exp>/tb/<run>/` |
| `wandb_logger` (`wandb`)           | `WandbLogger`       | `wandb/` run files, `wandb_id.txt`; experiments: one W&B run per run |
| `progress`                         | `ProgressBar`       | a tqdm bar on stderr                                 |
| `print_progress` (`print_metrics`) | `PrintMetrics`      | log lines per N steps, per run, per benchmark (logger `olingo.metrics`) |
| `early_stopping`                   | `EarlyStopping`     | nothing; calls `state.request_stop()`                |
| `rollout_samples`                  | `RolloutSamples`    | `samples.jsonl`: decoded rollouts at step 1, then every N steps (PPO, GRPO) |
| `performance`                      | `PerformanceEvaluator` | `perf.json`: generation vs learning time, throughput (PPO) |
| `local_logger` | `LocalLogger` (in `olingo.experiment.local_logger`) | `evals.jsonl`, `predictions/`, `result.json`, `summary.md`; `<exp>/experiment.md` |
| `debug_logger`                     | `DebugLogger`       | `hooks.jsonl`: every hook call in order               |
| `reward_monitor`                   | `RewardMonitor`     | `monitor/*` rows in `metrics.jsonl`, `monitor.json`, `best_gold/` (docs/monitor.md) |

Every module of this package is imported here so that importing the package registers all of
them. `LocalLogger` writes the experiment layer's results, so it lives in that layer
(`olingo.experiment.local_logger`): the registry imports it by module path on first lookup, and
`from olingo.trainer.callbacks.builtin import LocalLogger` resolves through the registry on first
use. Loggers write only on the master process (`state.is_master`). On a resumed run
(`state.step > 0` at `on_train_start`) the file loggers drop what the killed process wrote for
steps after `state.step`, since the resumed run recomputes those steps identically.
"""

from typing import Any

from olingo.trainer.callbacks.builtin.csv_metrics import CsvMetrics
from olingo.trainer.callbacks.builtin.debug_logger import DebugLogger
from olingo.trainer.callbacks.builtin.early_stopping import EarlyStopping
from olingo.trainer.callbacks.builtin.jsonl import JsonlMetrics, read_metrics
from olingo.trainer.callbacks.builtin.performance import PerformanceEvaluator
from olingo.trainer.callbacks.builtin.progress import PrintMetrics, ProgressBar
from olingo.trainer.callbacks.builtin.reward_monitor import RewardMonitor
from olingo.trainer.callbacks.builtin.samples import RolloutSamples
from olingo.trainer.callbacks.builtin.tensorboard_logger import TensorBoardLogger
from olingo.trainer.callbacks.builtin.wandb_logger import WandbLogger
from olingo.trainer.callbacks.registry import registered_callbacks

# Built-ins defined in a higher layer: class name -> kind, loaded through the registry on first use.
_LAZY = {"LocalLogger": "local_logger"}

__all__ = [
    "CsvMetrics",
    "DebugLogger",
    "EarlyStopping",
    "JsonlMetrics",
    "LocalLogger",
    "PerformanceEvaluator",
    "PrintMetrics",
    "ProgressBar",
    "RewardMonitor",
    "RolloutSamples",
    "TensorBoardLogger",
    "WandbLogger",
    "read_metrics",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return registered_callbacks()[_LAZY[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
