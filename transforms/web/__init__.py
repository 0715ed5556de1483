"""Web pages: inputs, fetch policy, rendering, curation and the MultiUI task generators."""
