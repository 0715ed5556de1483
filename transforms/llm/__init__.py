"""The LLM layer shared by selfmoe, multiui and rmaxts: requests, a response cache, backends.

  requests.py          Request, Sampling, Completion; the cache key
  backend.py           Backend: the base class of every backend (load / generate a batch / close / batch_size)
  transformers_backend.py, vllm_backend.py (with vllm_server.py), openai_backend.py: the backends
  models.py            which weights a model name means
  cache.py, cached.py  the response cache, and generation through it
  generate.py          Generate: requests -> completions in Beam (bounded batches, one loaded backend per process)
  ask.py               Ask: what a dataset's graph uses; requests out, completions joined back to their rows

Plain modules without Beam but the last two: a thin Beam wrapper calls them once per batch of requests.
"""
