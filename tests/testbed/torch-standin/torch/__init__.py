"""A stand-in for the part of torch that sparkform's fabric test uses, for the testbed's nodes
(no GPU, no NCCL). It is not on the image's default path: the testbed's fabric test puts its
folder on PYTHONPATH, so nothing else in the image sees it.

Tensors hold one fill value and a length; the all-reduce in `torch.distributed` is real (the
ranks exchange their values over TCP on the fabric) and takes as long as the bus bandwidth
SPARKFORM_STANDIN_BUSBW_GBPS (GB/s, default 10) says, so the test's arithmetic and sparkform's
parser see the figure the test bed asks for.
"""

from . import cuda, distributed  # noqa: F401

__version__ = "0.0-sparkform-standin"


class _DType:
    def __init__(self, name, size):
        self.name = name
        self.itemsize = size

    def __repr__(self):
        return f"torch.{self.name}"


float32 = _DType("float32", 4)


class _Scalar:
    def __init__(self, v):
        self._v = v

    def item(self):
        return self._v


class Tensor:
    def __init__(self, count, value, dtype=float32):
        self.count = int(count)
        self.value = float(value)
        self.dtype = dtype
        self._parent = None

    def numel(self):
        return self.count

    def element_size(self):
        return self.dtype.itemsize

    def fill_(self, v):
        self.value = float(v)
        return self

    def __getitem__(self, s):
        if not isinstance(s, slice):
            raise TypeError("the stand-in tensor takes slices only")
        start, stop, _ = s.indices(self.count)
        t = Tensor(max(0, stop - start), self.value, self.dtype)
        t._parent = self
        return t

    def __ne__(self, other):
        return _Mask(self.count if float(other) != self.value else 0)


class _Mask:
    def __init__(self, n):
        self.n = n

    def sum(self):
        return _Scalar(self.n)


def ones(count, dtype=float32, device=None):
    return Tensor(count, 1.0, dtype)


def empty(count, dtype=float32, device=None):
    return Tensor(count, 0.0, dtype)
