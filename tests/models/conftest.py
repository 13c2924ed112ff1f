"""What the kernel tests share."""

import pytest

from specdemo.models import kernels


@pytest.fixture
def each_isa():
    """Every ISA path this CPU runs, held in turn; the widest again after, and each ISA's own way for many rows."""
    yield kernels.supported_isas()
    kernels.use("")
    kernels.gemm_from(0)
