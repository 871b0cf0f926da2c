"""twexample::mul_rows — a torch.library custom op over the tensorwire C++ kernels in rowscale.cpp.

y[i, j] = x[i, j] * w[j]. The kernels need C-contiguous float32 input; contiguous_inputs provides it for whatever
the caller (or autograd, for the gradient) hands over: transposed views, slices, expanded (stride-0) tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

import tensorwire.torch as twt

import _rowscale


def _dl(t: Tensor):
    return t.detach().__dlpack__()


@torch.library.custom_op("twexample::mul_rows", mutates_args=())
@twt.contiguous_inputs
def mul_rows(x: Tensor, w: Tensor) -> Tensor:
    return torch.from_dlpack(_rowscale.mul_rows(_dl(x), _dl(w)))


@mul_rows.register_fake
def _(x: Tensor, w: Tensor) -> Tensor:
    return x.new_empty(x.shape)  # the kernel returns a C-contiguous tensor whatever x's strides


@torch.library.custom_op("twexample::mul_rows_backward", mutates_args=())
@twt.contiguous_inputs
def mul_rows_backward(g: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    gx, gw = _rowscale.mul_rows_backward(_dl(g), _dl(x), _dl(w))
    return torch.from_dlpack(gx), torch.from_dlpack(gw)


@mul_rows_backward.register_fake
def _(g: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, w = inputs
    ctx.save_for_backward(x, w)


def _backward(ctx, g: Tensor):
    x, w = ctx.saved_tensors
    return mul_rows_backward(g, x, w)


mul_rows.register_autograd(_backward, setup_context=_setup_context)
