"""The hub fixtures (`hub_fixtures`) for the hub tests."""

from hub_fixtures import hf_home, hub, quick_resume

__all__ = ["hf_home", "hub", "quick_resume"]
