"""The worked custom-op example: strided and expanded inputs and gradients (the DeepMD-kit bug), checked against
PyTorch's own arithmetic and with torch.library.opcheck. Run by `make test-install` (which builds _rowscale
against an installed tensorwire) with this folder and the build folder on PYTHONPATH."""

import pytest
import torch

import _rowscale
import rowscale


def reference(x, w):
    return x * w


def inputs(kind, requires_grad=True):
    g = torch.Generator().manual_seed(7)
    if kind == "contiguous":
        x = torch.randn(6, 5, generator=g)
    elif kind == "transposed":
        x = torch.randn(5, 6, generator=g).T
    elif kind == "sliced":
        x = torch.randn(12, 10, generator=g)[::2, 1::2]
    elif kind == "expanded":
        x = torch.randn(1, 5, generator=g).expand(6, 5)
    w = torch.randn(10, generator=g)[::2]
    if kind == "expanded":
        w = torch.randn(1, generator=g).expand(5)
    return x.detach().requires_grad_(requires_grad), w.detach().requires_grad_(requires_grad)


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced", "expanded"])
def test_values_and_gradients_match_the_reference(kind):
    x, w = inputs(kind)
    y = rowscale.mul_rows(x, w)
    assert y.is_contiguous()
    torch.testing.assert_close(y, reference(x, w), rtol=0, atol=0)
    # y.sum() hands backward an expanded (stride-0) gradient; y.T's a transposed one
    for loss in (lambda y: y.sum(), lambda y: (y.T * torch.arange(6.0)).sum()):
        x1, w1 = inputs(kind)
        loss(rowscale.mul_rows(x1, w1)).backward()
        x2, w2 = inputs(kind)
        loss(reference(x2, w2)).backward()
        torch.testing.assert_close(x1.grad, x2.grad)
        torch.testing.assert_close(w1.grad, w2.grad)


def test_the_kernel_alone_refuses_strided_input_instead_of_computing_garbage():
    x = torch.randn(5, 6).T
    w = torch.randn(5)
    with pytest.raises(ValueError, match="C-contiguous"):
        _rowscale.mul_rows(x.__dlpack__(), w.__dlpack__())


@pytest.mark.parametrize("kind", ["contiguous", "transposed", "sliced", "expanded"])
def test_opcheck(kind):
    x, w = inputs(kind)
    torch.library.opcheck(rowscale.mul_rows, (x, w))
    for g in (torch.ones(1, 5).expand(6, 5), torch.randn(5, 6).T):  # expanded and transposed gradients
        assert not g.is_contiguous()
        torch.library.opcheck(rowscale.mul_rows_backward, (g, x.detach(), w.detach()))

