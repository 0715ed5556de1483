"""Logging set-up for the command line (imports no Beam: it must run before Beam is imported)."""
import logging


class _QuietBeamImports(logging.Filter):
    """Beam warns on import that optional GCP client libraries are missing; they are not used."""

    def filter(self, record):
        return "apitools not found" not in record.getMessage()


def configure() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().addFilter(_QuietBeamImports())
