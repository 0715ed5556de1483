"""Logging set-up for the command line. Importing this module, before Beam is imported (the CLI
imports it first), hides the warning Beam logs on import about GCP client libraries it does not use;
`configure` then sets the format."""
import logging
import os


class _QuietBeamImports(logging.Filter):
    """Beam warns on import that optional GCP client libraries are missing; they are not used."""

    def filter(self, record):
        return "apitools not found" not in record.getMessage()


def configure() -> None:
    # model loading draws progress bars per worker; a pipeline's own summary says what happened
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    root = logging.getLogger()
    if _PLACEHOLDER in root.handlers:
        root.removeHandler(_PLACEHOLDER)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


# Until configure() runs: a root logger without handlers would be given Python's default one by the
# first logging.warning (Beam's, at import), and configure's format would then never apply.
_PLACEHOLDER = logging.NullHandler()
if not logging.getLogger().handlers:
    logging.getLogger().addHandler(_PLACEHOLDER)
logging.getLogger().addFilter(_QuietBeamImports())
