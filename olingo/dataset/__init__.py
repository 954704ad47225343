"""Datasets: raw formats -> validated examples -> token ids -> padded batches."""

from olingo.dataset.collator import PreferenceCollator
from olingo.dataset.errors import DataError
from olingo.dataset.loading import load_raw_rows
from olingo.dataset.preference import (
    PreferenceExample,
    parse_preference_row,
    tokenize_preference,
)
from olingo.dataset.preference_dataset import PreferenceDataset, build_preference_dataset

__all__ = [
    "DataError",
    "PreferenceCollator",
    "PreferenceDataset",
    "PreferenceExample",
    "build_preference_dataset",
    "load_raw_rows",
    "parse_preference_row",
    "tokenize_preference",
]

from olingo.dataset.sft import (  # noqa: E402
    SFTCollator,
    SFTDataset,
    SFTExample,
    build_sft_dataset,
    parse_sft_row,
    tokenize_sft,
)

__all__ += ["SFTCollator", "SFTDataset", "SFTExample", "build_sft_dataset", "parse_sft_row", "tokenize_sft"]

from olingo.dataset.unpaired import (  # noqa: E402
    UnpairedCollator,
    UnpairedDataset,
    UnpairedExample,
    build_unpaired_dataset,
    parse_unpaired_row,
    tokenize_unpaired,
)

__all__ += [
    "UnpairedCollator",
    "UnpairedDataset",
    "UnpairedExample",
    "build_unpaired_dataset",
    "parse_unpaired_row",
    "tokenize_unpaired",
]
