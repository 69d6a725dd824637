"""Hypothesis budgets for tests/fuzz: small and fixed under `make test`, large on demand.

    (default)               profile "ci": derandomized (the same examples every run), no
                            example database, no deadline; each property's own small budget
    STREAMPROXY_FUZZ=long   profile "long": random seeds, each budget times LONG_FACTOR (10, or
                            STREAMPROXY_FUZZ_FACTOR) for `make reliability`; a failure prints
                            the example and a @reproduce_failure blob

Properties take their budget from `fuzz_support.budget(n)`, which scales it by the profile.
"""

from __future__ import annotations

from tests.fuzz.fuzz_support import load_profile

load_profile()
