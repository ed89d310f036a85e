import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.environ.get("NEEDLE_TEST_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))


@pytest.fixture
def cq4():
    return os.path.join(FIXTURES, "tiny_cq4.cact")


@pytest.fixture
def cq2():
    return os.path.join(FIXTURES, "tiny_cq2.cact")
