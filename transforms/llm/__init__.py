"""The LLM layer shared by selfmoe, multiui and rmaxts: requests, a response cache, backends.

Plain modules without Beam: a thin Beam wrapper calls them once per batch of requests.
"""
