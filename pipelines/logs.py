"""Logging set-up for the command line (imports no Beam: it must run before Beam is imported)."""
import logging
import os


class _QuietBeamImports(logging.Filter):
    """Beam warns on import that optional GCP client libraries are missing; they are not used."""

    def filter(self, record):
        return "apitools not found" not in record.getMessage()


def configure() -> None:
    # model loading draws progress bars per worker; a pipeline's own summary says what happened
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().addFilter(_QuietBeamImports())
