"""Hypothesis profiles for the whole test suite.

* ``ci`` (default): fast and deterministic — ``derandomize=True`` (examples
  derived from each test's source, so a run is reproducible and never flaky),
  25 examples per property, no deadline (a busy CI machine must not fail a
  property on timing), no ``too_slow`` health check.
* ``thorough``: 500 random examples per property (``derandomize=False``, so
  repeated runs explore new inputs), for a local or nightly hunt:
  ``HYPOTHESIS_PROFILE=thorough python -m pytest tests/properties``.

The profile is chosen by the environment variable ``HYPOTHESIS_PROFILE``.
Tests that pass their own ``@settings(max_examples=...)`` keep that count and
inherit the rest of the profile.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=500,
    derandomize=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

# any registered profile name works (hypothesis's own "default" too); an unknown one is an error
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
