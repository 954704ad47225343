"""What every olingo actor sets up first: the logging the CLI sets up on the driver."""

from __future__ import annotations

import logging


def setup_worker_logging() -> None:
    """olingo's INFO messages reach the driver (Ray forwards actor output); transformers'
    per-load reports and progress bars, repeated by every actor, do not."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("olingo").setLevel(logging.INFO)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
